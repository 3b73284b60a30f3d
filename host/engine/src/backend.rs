//! What every compute backend (cpu, cuda, hip) provides to the generation loop.

use crate::config::ModelConfig;
use anyhow::Result;

pub trait Backend: Send + Sync {
    /// A sequence's device-side state (KV cache, GDN states, position).
    type Sequence: Send;

    fn name(&self) -> &'static str;
    fn config(&self) -> &ModelConfig;
    /// A fresh, empty sequence at position 0.
    fn new_sequence(&self) -> Self::Sequence;
    /// Number of tokens the sequence holds.
    fn position(&self, seq: &Self::Sequence) -> usize;
    /// Appends `tokens` (at least one) to the sequence and returns the logits
    /// (`vocab_size` f32) that predict the token after the last one.
    fn forward(&self, seq: &mut Self::Sequence, tokens: &[u32]) -> Result<Vec<f32>>;
}
