//! The engine's incremental detokenizer over the embedded Qwen3.6 vocabulary:
//! ids from the input (in and out of the vocabulary, special tokens
//! included), pushed one by one. Checks: no panic, and the concatenation of
//! every piece plus `finish` equals the tokenizer's one-shot decode of all
//! the ids (the invariant the streaming API relies on).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use qwasi_engine::tokenizer::{IncrementalDecoder, Tokenizer};
use qwasi_fuzz::Input;

/// The tokenizer and its size (`vocab_size` builds the whole vocabulary map:
/// once, not per input).
fn tokenizer() -> &'static (Tokenizer, u32) {
    static T: OnceLock<(Tokenizer, u32)> = OnceLock::new();
    T.get_or_init(|| {
        let t = Tokenizer::qwen36().expect("embedded tokenizer");
        let n = t.vocab_size() as u32;
        (t, n)
    })
}

fuzz_target!(|data: &[u8]| {
    let (tok, vocab) = tokenizer();
    let vocab = *vocab;
    let mut input = Input(data);
    let skip = input.byte() & 1 != 0;
    let mut ids = Vec::new();
    while !input.is_empty() && ids.len() < 4096 {
        // Mostly ids in the vocabulary, with the top of the range (special
        // tokens, then ids past the end) reachable from small inputs.
        let raw = input.u24();
        ids.push(if raw & 1 == 0 {
            (raw >> 1) % vocab
        } else {
            vocab - 40 + (raw >> 1) % 64
        });
    }
    let mut dec = IncrementalDecoder::new(tok.clone(), skip);
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&dec.push(id));
    }
    streamed.push_str(&dec.finish());
    assert!(!dec.has_pending());
    let whole = tok.decode(&ids, skip).expect("decode");
    assert_eq!(streamed, whole, "ids {ids:?}");
});
