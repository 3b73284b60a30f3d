#!/usr/bin/env python3
"""Generate the FP8 reference fixture: tests/fixtures/models/moe-fp8/.

A tiny random Qwen3.5/3.6 MoE in the layout of the published
`Qwen/Qwen3.6-35B-A3B-FP8` checkpoint: nested multimodal names, routed experts
stored per expert (`mlp.experts.N.{gate,up,down}_proj.weight`), every quantized
Linear weight as `F8_E4M3` with a `weight_scale_inv` per 128x128 block, and
`quantization_config` `{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
"dynamic", "weight_block_size": [128, 128], "modules_to_not_convert": [...]}`.

Quantization is transformers' own: `Fp8Quantize._quantize_one` of
transformers/integrations/finegrained_fp8.py (the op `save_pretrained` runs for
an FP8-quantized model; pure torch, runs on the CPU), through scripts/fp8_quant.py
(shared with scripts/device/fp8_checkpoint.py). It only quantizes tensors
whose dims are multiples of the block, so every quantized dim here is a multiple
of 128 (hidden 128, expert and shared intermediate 128, ...).

The reference is transformers loading the written directory with
`FineGrainedFP8Config(dequantize=True)` (its `Fp8Dequantize` op: fp8 -> f32,
times the f32 scale, rounded to the model dtype bf16), then computing in float32
on those bf16 weights exactly as scripts/make_fixtures.py does for BF16 models.

Regenerate:
    pip install -r scripts/requirements-fixtures.txt
    python3 scripts/make_fp8_fixture.py
"""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import FineGrainedFP8Config, Qwen3_5MoeForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_quant as fq  # noqa: E402
import make_fixtures as mf  # noqa: E402

FIXTURE = {
    "name": "moe-fp8",
    "kind": "moe",
    "layout": "nested",
    "seed": 4004,
    "shards": 2,
    "f32_gates": False,
    "text": {
        "vocab_size": 1024,
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
        "rope_parameters": mf.rope([4, 2, 2]),
    },
}


def quantization_config(n_layers):
    return fq.quantization_config(mf.layer_types(n_layers), "model.language_model.")


def checkpoint_tensors(model, fx):
    """The bf16 state dict in the published FP8 layout: experts unfused, per expert."""
    inter = fx["text"]["moe_intermediate_size"]
    out = {}
    for k, v in model.state_dict().items():
        out.update(fq.unfuse_experts(k, v.detach().to(torch.bfloat16).contiguous(), inter))
    return out


def save(tensors, fx, qcfg, out):
    names = sorted(tensors)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map, total = {}, 0
    for i, keys in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in keys}, str(out / fname), metadata={"format": "pt"})
        for k in keys:
            weight_map[k] = fname
            total += tensors[k].numel() * tensors[k].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    cfg = mf.nested_config_dict(fx)
    cfg["quantization_config"] = qcfg
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def own_dequant(q, s):
    """An independent restatement of the dequantization (numpy), to check transformers' result."""
    qf = q.to(torch.float32).numpy()
    sf = np.repeat(np.repeat(s.to(torch.float32).numpy(), 128, axis=0), 128, axis=1)
    prod = (qf * sf).astype(np.float32)
    return torch.from_numpy(prod).to(torch.bfloat16)


def main():
    assert transformers.__version__ == mf.TRANSFORMERS_VERSION, transformers.__version__
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    fx = FIXTURE
    out = mf.OUT_DIR / fx["name"]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    torch.manual_seed(fx["seed"])
    model = mf.build_model(fx)
    mf.randomize(model, fx)
    qcfg = quantization_config(fx["text"]["num_hidden_layers"])
    tensors, n_fp8 = fq.quantize(checkpoint_tensors(model, fx), qcfg)
    save(tensors, fx, qcfg, out)

    # The reference: transformers' own FP8 loader, dequantizing to bf16, computing in f32.
    ref = Qwen3_5MoeForConditionalGeneration.from_pretrained(
        str(out),
        dtype=torch.bfloat16,
        quantization_config=FineGrainedFP8Config(dequantize=True),
        **mf.impl_kwargs(fx),
    )
    ref_sd = ref.state_dict()
    checked = 0
    for k, v in tensors.items():
        if v.dtype != torch.float8_e4m3fn:
            continue
        scale = tensors[k[: -len(".weight")] + ".weight_scale_inv"]
        mine = own_dequant(v, scale)
        if ".mlp.experts." in k:
            base, e, proj = k.rsplit(".", 3)[0], int(k.split(".")[-3]), k.split(".")[-2]
            inter = fx["text"]["moe_intermediate_size"]
            if proj == "down_proj":
                theirs = ref_sd[f"{base}.down_proj"][e]
            else:
                gu = ref_sd[f"{base}.gate_up_proj"][e]
                theirs = gu[:inter] if proj == "gate_proj" else gu[inter:]
        else:
            theirs = ref_sd[k]
        assert theirs.dtype == torch.bfloat16, (k, theirs.dtype)
        assert torch.equal(mine.view(torch.int16), theirs.view(torch.int16)), f"dequantized {k} differs"
        checked += 1
    assert checked == n_fp8, (checked, n_fp8)
    ref = ref.float().eval()
    ref.generation_config.eos_token_id = None
    ref.generation_config.bos_token_id = None

    cases, infos = [], []
    for name, length in mf.PROMPT_LENGTHS:
        case, info = mf.run_case(ref, fx, name, mf.prompt_tokens(fx, length))
        assert info["nocache_argmax_ok"], name
        cases.append(case)
        infos.append(info)
    torch_version = torch.__version__.split("+")[0]
    expected = {
        "generator": f"transformers {transformers.__version__} / torch {torch_version}",
        "model_class": type(ref).__name__,
        "quantization": "fp8 e4m3, 128x128 blocks, dequantized by transformers (FineGrainedFP8Config(dequantize=True))",
        "cases": cases,
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")

    margins = np.array([m for i in infos for m in i["margins"]])
    print(f"== {fx['name']}: {n_fp8} FP8 tensors, dequantized bit-identically by transformers and numpy")
    for (name, _), c in zip(mf.PROMPT_LENGTHS, cases):
        print(f"   {name}: distinct tokens={len(set(c['generated']))}")
    print(f"   margins: median={np.median(margins):.3f} min={margins.min():.4f}")
    for f in sorted(out.iterdir()):
        print(f"   {f.name}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    sys.exit(main())
