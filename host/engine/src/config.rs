//! Model configuration: what `config.json` of a Qwen3.5/3.6 checkpoint says,
//! normalised to the numbers the engine computes with.
//!
//! Accepts the nested multimodal layout (`text_config` under a
//! `*ForConditionalGeneration` config) and the flat text-only layout.

use crate::fp8::Fp8Format;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::path::Path;

/// Architectures this engine runs (the text part of them).
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5ForCausalLM",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (linear attention with a recurrent state).
    Linear,
    /// Gated full attention with a KV cache.
    Full,
}

/// The feed-forward block of every layer.
#[derive(Clone, Debug, PartialEq)]
pub enum MlpConfig {
    Moe {
        num_experts: usize,
        top_k: usize,
        intermediate: usize,
        shared_intermediate: usize,
    },
    Dense {
        intermediate: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub layer_kinds: Vec<LayerKind>,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    // full attention
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub rotary_dim: usize,
    // gated delta net
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel: usize,
    pub mlp: MlpConfig,
    /// Token ids that end generation (from config.json or generation_config.json).
    pub eos_token_ids: Vec<u32>,
    /// `quantization_config` of a block-FP8 checkpoint; `None` for BF16 weights.
    pub quantization: Option<Fp8Format>,
}

impl ModelConfig {
    pub fn num_layers(&self) -> usize {
        self.layer_kinds.len()
    }
    /// Width of the GDN conv/qkv stream: q and k (key heads) then v (value heads).
    pub fn linear_conv_dim(&self) -> usize {
        2 * self.linear_key_dim() + self.linear_value_dim()
    }
    pub fn linear_key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }
    pub fn linear_value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }
    /// The GDN head geometry: (key heads, value heads, key dim, value dim).
    pub fn linear_heads(&self) -> (usize, usize, usize, usize) {
        (
            self.linear_num_key_heads,
            self.linear_num_value_heads,
            self.linear_key_head_dim,
            self.linear_value_head_dim,
        )
    }

    /// Reads `config.json` (and `generation_config.json` when present) from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let root: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        let mut cfg = Self::from_json(&root).with_context(|| format!("in {}", path.display()))?;
        let gen_path = dir.join("generation_config.json");
        if let Ok(gen_text) = std::fs::read_to_string(&gen_path) {
            let generation: Value = serde_json::from_str(&gen_text)
                .with_context(|| format!("{} is not valid JSON", gen_path.display()))?;
            for id in token_ids(generation.get("eos_token_id")) {
                if !cfg.eos_token_ids.contains(&id) {
                    cfg.eos_token_ids.push(id);
                }
            }
        }
        Ok(cfg)
    }

    /// Normalises a parsed `config.json`.
    pub fn from_json(root: &Value) -> Result<Self> {
        let architecture = root
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| {
                // transformers omits `architectures` in some text-only configs.
                match root.get("model_type").and_then(Value::as_str) {
                    Some("qwen3_5_moe_text") => Some("Qwen3_5MoeForCausalLM".into()),
                    Some("qwen3_5_text") => Some("Qwen3_5ForCausalLM".into()),
                    _ => None,
                }
            })
            .context("config has no `architectures` entry")?;
        if !SUPPORTED_ARCHITECTURES.contains(&architecture.as_str()) {
            bail!(
                "unsupported architecture {architecture:?} (supported: {})",
                SUPPORTED_ARCHITECTURES.join(", ")
            );
        }
        let text = root.get("text_config").unwrap_or(root);
        let f = Fields(text);

        let hidden_size = f.usize("hidden_size")?;
        let num_layers = f.usize("num_hidden_layers")?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        let head_dim = f
            .opt_usize("head_dim")?
            .unwrap_or(hidden_size / num_attention_heads.max(1));
        let layer_kinds = match text.get("layer_types") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|t| match t.as_str() {
                    Some("linear_attention") => Ok(LayerKind::Linear),
                    Some("full_attention") => Ok(LayerKind::Full),
                    other => bail!("unsupported layer type {other:?} in `layer_types`"),
                })
                .collect::<Result<Vec<_>>>()?,
            _ => {
                let interval = f.opt_usize("full_attention_interval")?.unwrap_or(4).max(1);
                (0..num_layers)
                    .map(|i| {
                        if (i + 1) % interval == 0 {
                            LayerKind::Full
                        } else {
                            LayerKind::Linear
                        }
                    })
                    .collect()
            }
        };
        if layer_kinds.len() != num_layers {
            bail!(
                "`layer_types` has {} entries but num_hidden_layers is {num_layers}",
                layer_kinds.len()
            );
        }

        let rope = text
            .get("rope_parameters")
            .or_else(|| text.get("rope_scaling"));
        let rope_f = |key: &str| {
            rope.and_then(|r| r.get(key))
                .or_else(|| text.get(key))
                .and_then(Value::as_f64)
        };
        if let Some(kind) = rope
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(Value::as_str)
            && kind != "default"
        {
            bail!("unsupported rope_type {kind:?} (only the default RoPE is implemented)");
        }
        let rope_theta = rope_f("rope_theta").unwrap_or(10_000_000.0);
        let partial = rope_f("partial_rotary_factor").unwrap_or(0.25);
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            bail!("partial_rotary_factor {partial} gives an invalid rotary dim {rotary_dim}");
        }

        let is_moe = architecture.starts_with("Qwen3_5Moe");
        let mlp = if is_moe {
            MlpConfig::Moe {
                num_experts: f.usize("num_experts")?,
                top_k: f.usize("num_experts_per_tok")?,
                intermediate: f.usize("moe_intermediate_size")?,
                shared_intermediate: f.usize("shared_expert_intermediate_size")?,
            }
        } else {
            MlpConfig::Dense {
                intermediate: f.usize("intermediate_size")?,
            }
        };
        if let MlpConfig::Moe {
            num_experts, top_k, ..
        } = mlp
            && (top_k == 0 || top_k > num_experts)
        {
            bail!("num_experts_per_tok {top_k} must be in 1..={num_experts}");
        }

        // transformers ties a nested model from the top-level flag only.
        let tie_word_embeddings = root
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut eos_token_ids = token_ids(text.get("eos_token_id"));
        for id in token_ids(root.get("eos_token_id")) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }

        let cfg = ModelConfig {
            architecture,
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            layer_kinds,
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            max_position_embeddings: f.opt_usize("max_position_embeddings")?.unwrap_or(262_144),
            tie_word_embeddings,
            num_attention_heads,
            num_key_value_heads: f.usize("num_key_value_heads")?,
            head_dim,
            rope_theta,
            rotary_dim,
            linear_num_key_heads: f.usize("linear_num_key_heads")?,
            linear_num_value_heads: f.usize("linear_num_value_heads")?,
            linear_key_head_dim: f.usize("linear_key_head_dim")?,
            linear_value_head_dim: f.usize("linear_value_head_dim")?,
            linear_conv_kernel: f.opt_usize("linear_conv_kernel_dim")?.unwrap_or(4),
            mlp,
            eos_token_ids,
            quantization: Fp8Format::from_config(root)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("vocab_size", self.vocab_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel),
        ];
        for (name, v) in positive {
            if v == 0 {
                bail!("{name} must be positive");
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if !self
            .linear_num_value_heads
            .is_multiple_of(self.linear_num_key_heads)
        {
            bail!(
                "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                self.linear_num_value_heads,
                self.linear_num_key_heads
            );
        }
        Ok(())
    }
}

/// `eos_token_id` may be a number or a list.
fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_u64)
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// Typed field access with messages that name the key.
struct Fields<'a>(&'a Value);

impl Fields<'_> {
    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .with_context(|| format!("missing `{key}` in the text config"))
    }
    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .with_context(|| format!("`{key}` must be a non-negative integer, got {v}")),
        }
    }
    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .with_context(|| format!("`{key}` must be a number, got {v}")),
        }
    }
}
