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

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::qwen36().expect("embedded tokenizer"))
}

fuzz_target!(|data: &[u8]| {
    let tok = tokenizer();
    let mut input = Input(data);
    let skip = input.byte() & 1 != 0;
    let vocab = tok.vocab_size() as u32;
    let mut ids = Vec::new();
    while !input.is_empty() && ids.len() < 4096 {
        // Mostly ids in the vocabulary, with the top of the range (special
        // tokens, then ids past the end) reachable from small inputs.
        let raw = input.u24();
        ids.push(if raw & 1 == 0 { (raw >> 1) % vocab } else { vocab - 40 + (raw >> 1) % 64 });
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
