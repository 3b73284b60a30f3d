"""Block-FP8 quantization in the layout of the published `Qwen/Qwen3.6-35B-A3B-FP8`,
shared by scripts/make_fp8_fixture.py (the small reference fixture) and
scripts/device/fp8_checkpoint.py (a BF16 checkpoint directory converted shard by
shard, for benchmarks).

Quantization is transformers' own: `Fp8Quantize._quantize_one` of
transformers/integrations/finegrained_fp8.py (the op `save_pretrained` runs for
an FP8-quantized model; pure torch, so it runs on the CPU or on a GPU tensor).
It only quantizes tensors whose dims are multiples of the block; the
checks here insist that every tensor meant to be FP8 was.
"""

import re

import torch
from transformers import FineGrainedFP8Config
from transformers.integrations.finegrained_fp8 import Fp8Quantize
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

BLOCK = [128, 128]


def modules_to_not_convert(layer_types, prefix="model.language_model."):
    """What the published checkpoint keeps in BF16, as its model card and
    third-party re-quantizations "matching Qwen's modules_to_not_convert" describe
    it (the list itself could not be downloaded here, so its exact spelling is
    reconstructed): the embedding, lm_head, the vision tower, the MTP head, and per
    layer the router, the shared-expert gate and the GDN's small projections
    (norms, conv, A_log and dt_bias are not Linear layers). The engine does not
    depend on the spelling: see docs/FP8.md.

    `layer_types`: the config's list ("linear_attention" / "full_attention");
    `prefix`: the text model's tensor prefix, "model.language_model." in the
    published multimodal layout, "model." in a text-only one."""
    names = ["lm_head", f"{prefix}embed_tokens", "model.visual", "mtp"]
    for i, kind in enumerate(layer_types):
        p = f"{prefix}layers.{i}"
        names += [f"{p}.mlp.gate", f"{p}.mlp.shared_expert_gate"]
        if kind == "linear_attention":
            names += [f"{p}.linear_attn.in_proj_a", f"{p}.linear_attn.in_proj_b"]
    return names


def quantization_config(layer_types, prefix="model.language_model."):
    return {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "modules_to_not_convert": modules_to_not_convert(layer_types, prefix),
        "quant_method": "fp8",
        "weight_block_size": BLOCK,
    }


def is_quantized(name, skip):
    """transformers' `should_convert_module` on the module of a Linear weight."""
    if not name.endswith(".weight") or name.startswith("model.visual."):
        return False
    module = name[: -len(".weight")]
    if any(re.match(f"{k}\\.", module) or re.match(k, module) or module.endswith(k) for k in skip):
        return False
    return True


def quantizer(qcfg):
    """transformers' `Fp8Quantize` op for the quantization_config dict `qcfg`."""
    cfg = FineGrainedFP8Config(**{k: v for k, v in qcfg.items() if k != "fmt"})
    op = Fp8Quantize(FineGrainedFP8HfQuantizer(cfg))
    if not hasattr(op, "_quantize_one"):
        raise SystemExit("this transformers has no Fp8Quantize._quantize_one (written against 5.17)")
    return op


def quantize_one(op, name, v):
    """{name: E4M3 tensor, <module>.weight_scale_inv: f32 [rows/128, cols/128]}
    for the 2-D bf16 weight `v` (on any device; the results stay there)."""
    q = op._quantize_one(name, v)
    assert q[name].dtype == torch.float8_e4m3fn, f"{name} {tuple(v.shape)} was not quantized"
    scale = q[name[: -len(".weight")] + ".weight_scale_inv"]
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (v.shape[0] // 128, v.shape[1] // 128)
    return q


def unfuse_experts(name, v, inter):
    """The published layout of routed experts: the fused `mlp.experts.gate_up_proj`
    [E, 2I, H] and `mlp.experts.down_proj` [E, H, I] that transformers' model
    holds (and `save_pretrained` of a BF16 model writes) as one tensor set per
    expert, `mlp.experts.N.{gate,up,down}_proj.weight`. Any other tensor is
    returned as it is. Yields (name, tensor) pairs; slices are contiguous copies."""
    if name.endswith("mlp.experts.gate_up_proj"):
        base = name[: -len("gate_up_proj")]
        assert v.ndim == 3 and v.shape[1] == 2 * inter, (name, tuple(v.shape), inter)
        for e in range(v.shape[0]):
            yield f"{base}{e}.gate_proj.weight", v[e, :inter].contiguous()
            yield f"{base}{e}.up_proj.weight", v[e, inter:].contiguous()
    elif name.endswith("mlp.experts.down_proj"):
        base = name[: -len("down_proj")]
        assert v.ndim == 3 and v.shape[2] == inter, (name, tuple(v.shape), inter)
        for e in range(v.shape[0]):
            yield f"{base}{e}.down_proj.weight", v[e].contiguous()
    else:
        yield name, v


def quantize(tensors, qcfg):
    """Every tensor of the dict `tensors` (the published layout, bf16) quantized
    as the checkpoint stores it: (the new dict, how many are FP8)."""
    op = quantizer(qcfg)
    skip = qcfg["modules_to_not_convert"]
    out, n_fp8 = {}, 0
    for k, v in tensors.items():
        if v.ndim == 2 and is_quantized(k, skip):
            out.update(quantize_one(op, k, v))
            n_fp8 += 1
        else:
            out[k] = v
    return out, n_fp8
