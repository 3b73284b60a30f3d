//! Shared by the engine's integration tests.

use serde_json::{Value, json};

/// A tiny nested (multimodal-layout) MoE config: vocab 300, hidden 32,
/// 4 layers (3 GDN + 1 attention), 4 experts top-2.
pub fn tiny_moe_config(eos: u32) -> Value {
    json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 4,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
            "linear_num_key_heads": 1, "linear_num_value_heads": 2,
            "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
            "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
            "eos_token_id": eos
        }
    })
}
