//! A constrained row's allowed tokens as the readouts take them: one bit
//! per token (bit `i % 32` of word `i / 32`), the layout of llguidance's
//! token sets and of `kernels/token_mask.h`, so a backend uploads the words
//! as they are (vocab / 32 words, ~31 KB for Qwen3.6) and its readout
//! kernels read a token left out as `-inf`.

use anyhow::Result;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl TokenMask {
    /// A mask of `vocab` tokens from a bitset's words (padded or cut to
    /// `vocab` bits; bits past `vocab` cleared).
    pub fn from_words(mut words: Vec<u32>, vocab: usize) -> Self {
        words.resize(vocab.div_ceil(32), 0);
        if !vocab.is_multiple_of(32)
            && let Some(last) = words.last_mut()
        {
            *last &= (1u32 << (vocab % 32)) - 1;
        }
        TokenMask { words }
    }

    /// Every token of `ids` allowed, none other.
    pub fn of(ids: &[u32], vocab: usize) -> Self {
        let mut words = vec![0u32; vocab.div_ceil(32)];
        for &t in ids.iter().filter(|&&t| (t as usize) < vocab) {
            words[t as usize / 32] |= 1 << (t % 32);
        }
        TokenMask { words }
    }

    pub fn words(&self) -> &[u32] {
        &self.words
    }

    pub fn allows(&self, token: u32) -> bool {
        self.words
            .get(token as usize / 32)
            .is_some_and(|w| w >> (token % 32) & 1 == 1)
    }

    /// `logits` (the tokens from `start` on) with the tokens left out at `-inf`.
    pub fn apply(&self, logits: &mut [f32], start: usize) {
        for (k, z) in logits.iter_mut().enumerate() {
            if !self.allows((start + k) as u32) {
                *z = f32::NEG_INFINITY;
            }
        }
    }

    /// A copy of the row `logits` under the mask.
    pub fn masked(&self, logits: &[f32]) -> Vec<f32> {
        let mut row = logits.to_vec();
        self.apply(&mut row, 0);
        row
    }
}

/// A constrained row's mask, asked for once per step when the backend
/// needs it: after it has launched the step's forward pass, so that the
/// host computes the mask (llguidance: up to a few ms for a permissive
/// grammar on a 248K vocabulary) while the device runs the layers.
pub type MaskSource<'a> = dyn FnMut() -> Result<TokenMask> + 'a;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_tokens_and_the_rest_is_minus_infinity() {
        let m = TokenMask::of(&[0, 5, 33, 69, 500], 70);
        assert_eq!(m.words().len(), 3);
        assert!(m.allows(0) && m.allows(33) && m.allows(69));
        assert!(!m.allows(1) && !m.allows(70) && !m.allows(500));
        let row: Vec<f32> = (0..70).map(|i| i as f32).collect();
        let masked = m.masked(&row);
        for (i, &z) in masked.iter().enumerate() {
            let want = if [0, 5, 33, 69].contains(&i) {
                i as f32
            } else {
                f32::NEG_INFINITY
            };
            assert_eq!(z, want, "token {i}");
        }
        let mut block = row[64..].to_vec();
        m.apply(&mut block, 64);
        assert_eq!(block[5], 69.0);
        assert_eq!(block[0], f32::NEG_INFINITY);
        // Words past the vocabulary's bits are cleared.
        let all = TokenMask::from_words(vec![u32::MAX; 4], 70);
        assert_eq!(all.words(), &[u32::MAX, u32::MAX, 0b11_1111]);
    }
}
