//! One rayon worker's own copy of the pipeline state that `tokenizers`
//! shares between threads (issue 27).
//!
//! `tokenizers::Tokenizer::encode_fast` on one shared tokenizer from many
//! threads goes through two shared structures: the pre-tokenizer's
//! `fancy-regex`, whose inner `regex` engines keep their scratch caches in a
//! pool with a fast path for one owner thread only (the others share a few
//! mutex-guarded stacks and throw away, under contention, caches and the lazy
//! DFA states they hold), and the BPE model's word cache, an `RwLock` that
//! every word locks for reading. A worker runs the same pipeline through the
//! public API with its own pre-tokenizer (cloning `Split` compiles its regex
//! anew) and its own word cache in front of the shared model; the model
//! itself (vocabulary and merges) stays shared.

use std::collections::HashMap;
use tokenizers::{Model, OffsetReferential, OffsetType, PreTokenizer};

/// Words a worker remembers (the BPE model's own cache holds 10,000).
const WORDS: usize = 10_000;
/// Longer words are not remembered (as in the BPE model's cache).
const WORD_MAX: usize = 256;

/// How a piece is encoded (measured against each other by the bench).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `encode_fast` on the shared tokenizer.
    Shared,
    /// The worker's own pre-tokenizer; the shared model and its cache.
    OwnPreTokenizer,
    /// The worker's own pre-tokenizer and word cache.
    OwnWords,
}

pub(super) struct Worker {
    pre: Option<tokenizers::PreTokenizerWrapper>,
    /// A word's ids, by its byte-level spelling.
    words: HashMap<String, Box<[u32]>>,
}

impl Worker {
    pub(super) fn new(tok: &tokenizers::Tokenizer) -> Self {
        Self {
            pre: tok.get_pre_tokenizer().cloned(),
            words: HashMap::new(),
        }
    }

    /// Appends the ids of `piece` to `ids`: what `tok.encode_fast(piece,
    /// false)` gives when `tok` has no truncation or padding and its model
    /// is deterministic (checked by `Splitter::for_tokenizer`).
    pub(super) fn encode(
        &mut self,
        tok: &tokenizers::Tokenizer,
        piece: &str,
        mode: Mode,
        ids: &mut Vec<u32>,
    ) -> tokenizers::Result<()> {
        if mode == Mode::Shared {
            ids.extend_from_slice(tok.encode_fast(piece, false)?.get_ids());
            return Ok(());
        }
        // The steps of `encode_fast`: added tokens cut out and the rest
        // normalised, pre-tokenized, each word through the model.
        let mut pre = tok
            .get_added_vocabulary()
            .extract_and_normalize(tok.get_normalizer(), piece);
        if let Some(p) = &self.pre {
            p.pre_tokenize(&mut pre)?;
        }
        let model = tok.get_model();
        for (word, _, tokens) in pre.get_splits(OffsetReferential::Original, OffsetType::None) {
            if let Some(tokens) = tokens {
                // An added token.
                ids.extend(tokens.iter().map(|t| t.id));
            } else if mode == Mode::OwnPreTokenizer {
                ids.extend(model.tokenize(word)?.iter().map(|t| t.id));
            } else if let Some(known) = self.words.get(word) {
                ids.extend_from_slice(known);
            } else {
                let start = ids.len();
                ids.extend(model.tokenize(word)?.iter().map(|t| t.id));
                if self.words.len() < WORDS && word.len() < WORD_MAX {
                    self.words.insert(word.to_owned(), ids[start..].into());
                }
            }
        }
        Ok(())
    }
}
