//! The token environment llguidance computes masks over, built from our own
//! [`Tokenizer`] (the `toktrie_hf_tokenizers` adapter pins `tokenizers`
//! 0.21 and would compile a second copy next to the engine's 0.22).

use crate::tokenizer::Tokenizer;
use anyhow::{Result, bail};
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use std::sync::Arc;

struct Env {
    trie: TokTrie,
    tok: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |s| {
            self.tok
                .hf()
                .encode_fast(s, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// Every id of the model's `vocab_size` rows as bytes: special tokens as
/// llguidance's marker byte plus their text (grammars name them as
/// `<tool_call>`), ids past the tokenizer (embedding padding) as unnamed
/// special tokens no grammar allows. `eos` ends a grammar (the model's EOS ids).
pub fn token_env(tok: &Tokenizer, vocab_size: usize, eos: &[u32]) -> Result<TokEnv> {
    if eos.is_empty() {
        bail!("the model has no EOS token to end a constrained output");
    }
    // (`vocab_size` copies the tokenizer's vocabulary: once.)
    let tokens = tok.vocab_size();
    if tokens > vocab_size {
        bail!("the tokenizer has {tokens} tokens but the model only {vocab_size}");
    }
    let words: Vec<Vec<u8>> = (0..vocab_size as u32)
        .map(|id| {
            if (id as usize) >= tokens {
                let mut w = format!(" <[{id}]>").into_bytes();
                w[0] = TokTrie::SPECIAL_TOKEN_MARKER;
                w
            } else if tok.is_special(id) {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend(tok.decode_bytes(id));
                w
            } else {
                tok.decode_bytes(id)
            }
        })
        .collect();
    let info = TokRxInfo::new(vocab_size as u32, eos[0]);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
    Ok(Arc::new(Env {
        trie,
        tok: tok.clone(),
    }))
}
