//! The embedded demo model: a small seeded random model of the Qwen3.6
//! architecture (GDN + gated attention, MoE) with the real Qwen3.6 tokenizer,
//! so the whole stack runs anywhere with no download. Its text is meaningless.

use crate::checkpoint::WeightSource;
use crate::config::{LayerKind, MlpConfig, ModelConfig};
use crate::tensor::Mat;
use anyhow::Result;
use half::bf16;

pub const DEMO_MODEL_ID: &str = "qwasi-demo";
const SEED: u64 = 0x5157_4153_4931; // "QWASI1"

/// The demo geometry: Qwen3.6's layout (3 GDN layers per attention layer,
/// key-head sharing, partial RoPE, top-k MoE plus a shared expert) at a size
/// that decodes quickly on two cores.
pub fn config() -> ModelConfig {
    ModelConfig {
        architecture: "Qwen3_5MoeForCausalLM".into(),
        vocab_size: 248_320,
        hidden_size: 256,
        layer_kinds: (0..8)
            .map(|i| {
                if i % 4 == 3 {
                    LayerKind::Full
                } else {
                    LayerKind::Linear
                }
            })
            .collect(),
        rms_norm_eps: 1e-6,
        max_position_embeddings: 32_768,
        tie_word_embeddings: true,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        rope_theta: 10_000_000.0,
        rotary_dim: 16,
        linear_num_key_heads: 2,
        linear_num_value_heads: 4,
        linear_key_head_dim: 64,
        linear_value_head_dim: 64,
        linear_conv_kernel: 4,
        mlp: MlpConfig::Moe {
            num_experts: 16,
            top_k: 4,
            intermediate: 128,
            shared_intermediate: 128,
        },
        // <|im_end|>, <|endoftext|>
        eos_token_ids: vec![248_046, 248_044],
        quantization: None,
    }
}

/// Seeded random weights, each tensor's stream derived from its name so the
/// model is the same on every machine.
pub struct RandomWeights {
    pub seed: u64,
}

impl Default for RandomWeights {
    fn default() -> Self {
        RandomWeights { seed: SEED }
    }
}

/// splitmix64: tiny, fast, and stable across platforms and crate versions
/// (also the GPU checks' seeded operands).
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

impl RandomWeights {
    fn rng(&self, name: &str) -> Rng {
        // FNV-1a of the name, mixed with the model seed.
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        Rng(h ^ self.seed)
    }

    /// Uniform values with the standard deviation `std`.
    fn values(&self, name: &str, n: usize, std: f32) -> Vec<f32> {
        let mut r = self.rng(name);
        let a = std * 3f32.sqrt();
        (0..n).map(|_| r.uniform() * a).collect()
    }
}

impl WeightSource for RandomWeights {
    fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat> {
        // Embeddings get a larger scale so the tied lm_head has a wide logit spread.
        let std = if name.starts_with("embed_tokens") {
            0.5
        } else {
            1.0 / (cols as f32).sqrt()
        };
        let v = self.values(name, rows * cols, std);
        Ok(Mat::from_vec(
            rows,
            cols,
            v.into_iter().map(bf16::from_f32).collect(),
        ))
    }

    fn mats(&self, name: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Mat>> {
        Ok(self.mat(name, n * rows, cols)?.split_rows(n))
    }

    fn vector(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let n: usize = shape.iter().product();
        let mut r = self.rng(name);
        Ok(if name.ends_with("A_log") {
            (0..n)
                .map(|_| (1.0 + 7.5 * (r.uniform() + 1.0)).ln())
                .collect()
        } else if name.ends_with("dt_bias") {
            (0..n).map(|_| 0.5 * r.uniform()).collect()
        } else if name.ends_with("conv1d.weight") {
            (0..n).map(|_| 0.5 * r.uniform()).collect()
        } else if name.ends_with("linear_attn.norm.weight") {
            (0..n).map(|_| 1.0 + 0.1 * r.uniform()).collect()
        } else {
            // (1 + w) norms: w near zero.
            (0..n).map(|_| 0.1 * r.uniform()).collect()
        })
    }

    fn has(&self, name: &str) -> bool {
        name != "lm_head.weight"
    }
}
