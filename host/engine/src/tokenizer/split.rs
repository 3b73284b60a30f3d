//! Long texts encoded in pieces on several cores, with exactly the ids of
//! encoding the whole text.
//!
//! BPE merges never cross a pre-token, and `tokenizers` cuts the text at
//! special tokens, then normalises (NFC) and pre-tokenizes each part with a
//! regex. For the Qwen3.5/3.6 regex
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! a position `p` whose previous character is a letter or mark (`\p{L}`,
//! `\p{M}`) and whose own character is neither always ends a pre-token:
//! the only alternatives that take a letter are the contractions (which
//! would need a letter at `p` to go on) and the letter run (which stops
//! at `p`). So the pre-token that holds `p - 1` ends at `p` whatever
//! follows (the text cut at `p` gives the same pre-tokens before it: every
//! alternative's decision there depends only on the character at `p` being
//! a non-letter or on there being none), and the regex has no look-behind,
//! so matching from `p` on is the same as matching the rest alone. The
//! character at `p` is no mark and no letter, so NFC composes nothing
//! across `p` either. Such a `p` is a split point unless a special token's
//! text spans it.
//!
//! [`Splitter::for_tokenizer`] accepts only a pipeline that this argument
//! covers (that regex, NFC or no normalizer, byte-level BPE without dropout,
//! special tokens without `lstrip`/`rstrip`/`single_word`/`normalized`, no
//! truncation or padding); for any other tokenizer the text is encoded
//! whole. The equivalence is tested against whole-text encoding over many
//! texts (tests below). Each rayon worker encodes its pieces with its own
//! pre-tokenizer and word cache ([`worker`]).

mod worker;

use rayon::prelude::*;
use serde_json::{Value, json};
use std::sync::{Mutex, OnceLock};
pub use worker::Mode;

/// Texts shorter than this are encoded whole (a piece's fixed cost would
/// eat the gain).
const MIN_PARALLEL: usize = 8 << 10;
/// Target piece size in bytes.
const PIECE: usize = 2 << 10;

/// The Qwen3.5/3.6 pre-tokenizer the split points are proven for.
fn qwen_pre_tokenizer() -> Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
         "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]})
}

/// Where a text may be cut for one tokenizer.
#[derive(Debug)]
pub(super) struct Splitter {
    /// `\p{L}` ∪ `\p{M}` as sorted ranges (the regex crate's own tables, the
    /// ones the pre-tokenizer's regex uses).
    letters: Vec<(char, char)>,
    /// The special tokens' texts.
    specials: Vec<Vec<u8>>,
    /// Bytes per piece (tests cut finer).
    piece: usize,
    min_parallel: usize,
    /// One per rayon worker (by `current_thread_index`), made on first use.
    workers: OnceLock<Box<[Slot]>>,
}

/// A worker's state, alone on its cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Slot(Mutex<Option<worker::Worker>>);

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

impl Splitter {
    /// A splitter when `tok`'s pipeline is the one the split points are
    /// proven for; `None` otherwise.
    pub(super) fn for_tokenizer(tok: &tokenizers::Tokenizer) -> Option<Self> {
        let pre = serde_json::to_value(tok.get_pre_tokenizer()?).ok()?;
        if pre != qwen_pre_tokenizer() {
            return None;
        }
        match tok.get_normalizer() {
            None => {}
            Some(n) if serde_json::to_value(n).ok()? == json!({"type": "NFC"}) => {}
            Some(_) => return None,
        }
        match tok.get_model() {
            tokenizers::ModelWrapper::BPE(b) if b.dropout.is_none_or(|d| d == 0.0) => {}
            _ => return None,
        }
        if tok.get_truncation().is_some() || tok.get_padding().is_some() {
            return None;
        }
        let mut specials = Vec::new();
        for t in tok.get_added_tokens_decoder().values() {
            if !t.special || t.lstrip || t.rstrip || t.single_word || t.normalized {
                return None;
            }
            specials.push(t.content.as_bytes().to_vec());
        }
        let class = regex_syntax::parse(r"[\p{L}\p{M}]").ok()?;
        let regex_syntax::hir::HirKind::Class(regex_syntax::hir::Class::Unicode(c)) = class.kind()
        else {
            return None;
        };
        let letters = c.ranges().iter().map(|r| (r.start(), r.end())).collect();
        Some(Splitter {
            letters,
            specials,
            piece: PIECE,
            min_parallel: MIN_PARALLEL,
            workers: OnceLock::new(),
        })
    }

    /// Cut finer (tests): pieces of about `piece` bytes from `min_parallel` bytes on.
    #[cfg(test)]
    pub(super) fn with_sizes(mut self, piece: usize, min_parallel: usize) -> Self {
        self.piece = piece.max(1);
        self.min_parallel = min_parallel;
        self
    }

    fn letter(&self, c: char) -> bool {
        self.letters
            .binary_search_by(|&(lo, hi)| {
                if hi < c {
                    std::cmp::Ordering::Less
                } else if lo > c {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
    }

    /// A special token's text spans `p` (starts before it, ends after it).
    fn in_special(&self, text: &[u8], p: usize) -> bool {
        self.specials
            .iter()
            .any(|s| (1..s.len()).any(|i| p >= i && text[p - i..].starts_with(s)))
    }

    /// The first split point in `[from, to)`, if any.
    fn split_point(&self, text: &str, from: usize, to: usize) -> Option<usize> {
        let mut prev_letter = false;
        // Round up: a piece never ends before its target (nor is empty).
        let start = (from..=text.len()).find(|&i| text.is_char_boundary(i))?;
        // The character before `start`, if any.
        if let Some(c) = text[..start].chars().next_back() {
            prev_letter = self.letter(c);
        }
        for (i, c) in text[start..].char_indices() {
            let p = start + i;
            if p >= to {
                break;
            }
            let letter = self.letter(c);
            if p > 0 && prev_letter && !letter && !self.in_special(text.as_bytes(), p) {
                return Some(p);
            }
            prev_letter = letter;
        }
        None
    }

    /// `text` cut at split points into pieces of about the target size
    /// (the whole text when it is short or has no split point).
    #[cfg(test)]
    pub(super) fn pieces<'a>(&self, text: &'a str) -> Vec<&'a str> {
        self.pieces_of(text, self.piece)
    }

    fn pieces_of<'a>(&self, text: &'a str, piece: usize) -> Vec<&'a str> {
        if text.len() < self.min_parallel {
            return vec![text];
        }
        let mut pieces = Vec::with_capacity(text.len() / piece + 1);
        let mut start = 0;
        while text.len() - start > piece {
            match self.split_point(text, start + piece, text.len()) {
                Some(p) => {
                    pieces.push(&text[start..p]);
                    start = p;
                }
                None => break,
            }
        }
        pieces.push(&text[start..]);
        pieces
    }

    /// The ids of `text` (already NFC) encoded piece by piece in parallel.
    pub(super) fn encode(
        &self,
        tok: &tokenizers::Tokenizer,
        text: &str,
    ) -> tokenizers::Result<Vec<u32>> {
        // One thread: pieces only add their fixed cost.
        if rayon::current_num_threads() == 1 {
            return Ok(tok.encode_fast(text, false)?.get_ids().to_vec());
        }
        self.encode_with(tok, text, self.piece, Mode::OwnWords, true)
    }

    /// `text` cut into pieces of about `piece` bytes, each encoded as
    /// `mode` says, on the rayon pool (`parallel`) or one after the other
    /// on one of its workers.
    #[doc(hidden)]
    pub fn encode_with(
        &self,
        tok: &tokenizers::Tokenizer,
        text: &str,
        piece: usize,
        mode: Mode,
        parallel: bool,
    ) -> tokenizers::Result<Vec<u32>> {
        let pieces = self.pieces_of(text, piece.max(1));
        if pieces.len() == 1 {
            return Ok(tok.encode_fast(text, false)?.get_ids().to_vec());
        }
        let one = |p: &&str| self.encode_piece(tok, p, mode);
        let parts: Vec<Vec<u32>> = if parallel {
            pieces
                .par_iter()
                .map(one)
                .collect::<tokenizers::Result<_>>()?
        } else {
            rayon::join(
                || pieces.iter().map(one).collect::<tokenizers::Result<_>>(),
                || (),
            )
            .0?
        };
        Ok(parts.concat())
    }

    /// The ids of one piece, with the calling worker's own state (the
    /// shared tokenizer's when the caller is no worker of a pool this size
    /// or another thread holds that state).
    fn encode_piece(
        &self,
        tok: &tokenizers::Tokenizer,
        piece: &str,
        mode: Mode,
    ) -> tokenizers::Result<Vec<u32>> {
        let slots = self.workers.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..rayon::current_num_threads().max(cores))
                .map(|_| Slot::default())
                .collect()
        });
        let mut ids = Vec::with_capacity(piece.len() / 2);
        let slot = rayon::current_thread_index().and_then(|i| slots.get(i));
        match slot.and_then(|s| s.0.try_lock().ok()) {
            Some(mut w) => w
                .get_or_insert_with(|| worker::Worker::new(tok))
                .encode(tok, piece, mode, &mut ids)?,
            None => ids.extend_from_slice(tok.encode_fast(piece, false)?.get_ids()),
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests;
