//! Built-in model geometries, for synthetic (random-weight) runs without a checkpoint.

use crate::config::{LayerKind, MlpConfig, ModelConfig};
use crate::fp8::Fp8Format;
use anyhow::{Result, bail};

/// Qwen3.6-35B-A3B (same text geometry as Qwen3.5-35B-A3B): 40 layers, every
/// 4th full attention, 256 experts top-8, untied lm_head.
pub fn qwen36_35b_a3b() -> ModelConfig {
    ModelConfig {
        architecture: "Qwen3_5MoeForCausalLM".into(),
        vocab_size: 248_320,
        hidden_size: 2048,
        layer_kinds: (0..40)
            .map(|i| {
                if i % 4 == 3 {
                    LayerKind::Full
                } else {
                    LayerKind::Linear
                }
            })
            .collect(),
        rms_norm_eps: 1e-6,
        max_position_embeddings: 262_144,
        tie_word_embeddings: false,
        num_attention_heads: 16,
        num_key_value_heads: 2,
        head_dim: 256,
        rope_theta: 10_000_000.0,
        rotary_dim: 64,
        linear_num_key_heads: 16,
        linear_num_value_heads: 32,
        linear_key_head_dim: 128,
        linear_value_head_dim: 128,
        linear_conv_kernel: 4,
        mlp: MlpConfig::Moe {
            num_experts: 256,
            top_k: 8,
            intermediate: 512,
            shared_intermediate: 512,
        },
        eos_token_ids: vec![248_046, 248_044],
        quantization: None,
    }
}

/// A preset by name (`qwen3.6-35b-a3b`, alias `qwen3.5-35b-a3b`; with
/// `-fp8` the same geometry as a block-FP8 checkpoint, for synthetic GPU models).
pub fn by_name(name: &str) -> Result<ModelConfig> {
    match name.to_ascii_lowercase().as_str() {
        "qwen3.6-35b-a3b" | "qwen3.5-35b-a3b" | "qwen3.6-35b" => Ok(qwen36_35b_a3b()),
        "qwen3.6-35b-a3b-fp8" | "qwen3.5-35b-a3b-fp8" | "qwen3.6-35b-fp8" => Ok(ModelConfig {
            quantization: Some(Fp8Format::block_128()),
            ..qwen36_35b_a3b()
        }),
        other => {
            bail!("unknown model preset {other:?} (known: qwen3.6-35b-a3b, qwen3.6-35b-a3b-fp8)")
        }
    }
}

/// The first `n` layers of `cfg` (the layer pattern kept), for reduced-depth runs.
pub fn with_layers(mut cfg: ModelConfig, n: usize) -> Result<ModelConfig> {
    if n == 0 || n > cfg.layer_kinds.len() {
        bail!("--layers must be in 1..={}", cfg.layer_kinds.len());
    }
    cfg.layer_kinds.truncate(n);
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    #[test]
    fn preset_geometry() {
        let c = super::qwen36_35b_a3b();
        assert_eq!(c.num_layers(), 40);
        assert_eq!(
            c.layer_kinds
                .iter()
                .filter(|k| **k == super::LayerKind::Full)
                .count(),
            10
        );
        assert_eq!(c.linear_conv_dim(), 8192);
        assert_eq!(c.linear_value_dim(), 4096);
    }

    #[test]
    fn fp8_preset_is_the_same_geometry_with_block_fp8_weights() {
        let (b, q) = (
            super::by_name("qwen3.6-35b-a3b").unwrap(),
            super::by_name("Qwen3.6-35B-A3B-FP8").unwrap(),
        );
        assert!(b.quantization.is_none());
        let f = q.quantization.as_ref().unwrap();
        assert!(f.expects_fp8("model.layers.0.mlp.experts.3.down_proj.weight", 2048, 512));
        assert!(!f.expects_fp8("model.layers.0.mlp.gate.weight", 256, 2048));
        assert_eq!(
            (q.num_layers(), q.hidden_size, q.layer_kinds),
            (b.num_layers(), b.hidden_size, b.layer_kinds)
        );
        assert!(super::by_name("qwen3.6-35b-a3b-int4").is_err());
    }
}
