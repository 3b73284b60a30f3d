#!/usr/bin/env python3
"""Full-width, reduced-depth reference for the GPU backend (runs on the GPU machine).

Builds a Qwen3.6-35B-A3B-width text model (hidden 2048, 256 experts top-8, GDN
16/32 heads x 128, attention 16/2 x 256, vocab 248320) with N layers (default 8:
attention at 3 and 7) and random weights rounded to bf16, writes it as a model
directory (config.json + model.safetensors, fused experts), and runs
transformers' Qwen3_5MoeForCausalLM in float32 (eager attention, TF32 off) on
exactly those weights: last-token logits of seeded random prompts (1, 1K, 8K
tokens by default) and 64 greedy tokens each (with each step's top-1 margin).
With --dtype both, then the same model in bfloat16 (every parameter bf16, as
from_pretrained(dtype=torch.bfloat16) builds it; the RoPE inverse frequencies
stay float32 as they are computed) on the same prompts: last-token logits
only, the yardstick of what bf16 inference loses against float32.

    python3 scripts/device/compare_transformers.py OUTDIR [--layers 8] [--lens 1,1024,8192] [--gen 64] [--dtype f32|both]

Then: qwasi verify --backend cuda --compare OUTDIR [--prefill-precision bf16].
Writes OUTDIR/model/{config.json,model.safetensors} and OUTDIR/ref.json,
OUTDIR/logits_<len>.f32 (raw little-endian float32, vocab entries) and, with
--dtype both, OUTDIR/logits_bf16_<len>.f32 (the bf16 run's logits as float32).
"""

import argparse
import json
import math
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AttentionInterface, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig


def text_config(layers):
    return dict(
        vocab_size=248320,
        hidden_size=2048,
        num_hidden_layers=layers,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        rms_norm_eps=1e-6,
        max_position_embeddings=262144,
        tie_word_embeddings=False,
        attn_output_gate=True,
        full_attention_interval=4,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    )


def init_value(name, shape, gen, hidden):
    """As scripts/make_fixtures.py: spread values so greedy choices have margins."""
    dev = "cuda"

    def normal(std, mean=0.0):
        return torch.randn(shape, generator=gen, device=dev, dtype=torch.float32) * std + mean

    def uniform(lo, hi):
        return torch.rand(shape, generator=gen, device=dev, dtype=torch.float32) * (hi - lo) + lo

    if name.endswith("embed_tokens.weight"):
        return normal(1.0)
    if name == "lm_head.weight":
        return normal(4.0 / math.sqrt(hidden))  # logits ~ N(0, 4^2), as the fixtures
    if name.endswith("linear_attn.A_log"):
        return uniform(1.0, 16.0).log()
    if name.endswith("linear_attn.dt_bias"):
        dt = uniform(math.log(1e-3), math.log(1e-1)).exp()
        return dt + torch.log(-torch.expm1(-dt))
    if name.endswith("linear_attn.norm.weight"):
        return normal(0.1, 1.0)
    if name.endswith("norm.weight"):
        return normal(0.1)
    if name.endswith("linear_attn.conv1d.weight"):
        return normal(1.0 / math.sqrt(shape[-1]))
    if name.endswith("mlp.gate.weight"):
        return normal(2.5 / math.sqrt(hidden))
    if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
        return normal(1.0 / math.sqrt(shape[2]))
    if name.endswith(".weight") and len(shape) == 2:
        return normal(1.0 / math.sqrt(shape[1]))
    raise ValueError(f"no init rule for {name} {shape}")


def chunked_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Causal GQA attention in float32 over blocks of queries.

    sdpa in float32 materialises the whole [heads, q, k] score matrix at 32K
    tokens (64 GB); this computes the same softmax(q k^T * scaling) v one block
    of 1024 queries at a time. Query i of the call sits at position
    k_len - q_len + i and sees keys 0..=that (prefill and cached decode alike).
    Returns [batch, q, heads, head_dim] like transformers' attention functions.
    """
    b, h, q_len, d = query.shape
    rep = h // key.shape[1]
    k = key.repeat_interleave(rep, dim=1)
    v = value.repeat_interleave(rep, dim=1)
    k_len = k.shape[2]
    scale = scaling if scaling is not None else d**-0.5
    out = torch.empty_like(query)
    keys = torch.arange(k_len, device=query.device)
    for s in range(0, q_len, 1024):
        e = min(q_len, s + 1024)
        pos = torch.arange(s, e, device=query.device) + (k_len - q_len)
        scores = torch.matmul(query[:, :, s:e], k.transpose(-1, -2)) * scale
        scores.masked_fill_(keys[None, :] > pos[:, None], float("-inf"))
        out[:, :, s:e] = torch.matmul(torch.softmax(scores, dim=-1), v)
    return out.transpose(1, 2).contiguous(), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--lens", default="1,1024,8192")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument(
        "--attn",
        default="eager",
        help="eager; sdpa; or chunked: exact causal attention in f32, 1024 queries at a time (32K+ prompts)",
    )
    ap.add_argument(
        "--dtype",
        default="f32",
        choices=["f32", "both"],
        help="f32: the float32 reference; both: then the bfloat16 model's last-token logits too",
    )
    a = ap.parse_args()
    if a.attn == "chunked":
        AttentionInterface.register("chunked", chunked_attention)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = Path(a.out)
    (out / "model").mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cfg = Qwen3_5MoeTextConfig(**text_config(a.layers))
    with torch.device("cuda"):
        model = Qwen3_5MoeForCausalLM._from_config(
            cfg, dtype=torch.float32, attn_implementation=a.attn, experts_implementation="eager"
        ).eval()
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    tensors = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            v = init_value(name, tuple(p.shape), gen, 2048)
            if name.endswith(("linear_attn.A_log", "linear_attn.dt_bias")):
                tensors[name] = v.detach().cpu().contiguous()  # kept f32 in the checkpoint
            else:
                v = v.to(torch.bfloat16)
                tensors[name] = v.detach().cpu().contiguous()
                v = v.to(torch.float32)
            p.copy_(v)
    print(f"[ref] model built in {time.time() - t0:.1f} s", flush=True)
    t0 = time.time()
    save_file(tensors, str(out / "model" / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    cd = text_config(a.layers)
    cd.update({"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "dtype": "bfloat16"})
    (out / "model" / "config.json").write_text(json.dumps(cd, indent=2) + "\n")
    print(f"[ref] saved in {time.time() - t0:.1f} s", flush=True)

    g = torch.Generator().manual_seed(a.seed + 1)
    cases = []
    prompts = []
    for L in [int(x) for x in a.lens.split(",") if x]:
        ids = torch.randint(0, 248320, (1, L), generator=g)
        prompts.append((L, ids))
        t0 = time.time()
        with torch.no_grad():
            logits = model(input_ids=ids.cuda(), logits_to_keep=1, use_cache=False).logits[0, -1].float().cpu()
        t_fwd = time.time() - t0
        logits.numpy().astype("<f4").tofile(out / f"logits_{L}.f32")
        t0 = time.time()
        with torch.no_grad():
            res = model.generate(
                ids.cuda(), max_new_tokens=a.gen, do_sample=False, output_scores=True,
                return_dict_in_generate=True, pad_token_id=0, eos_token_id=None,
            )
        toks = res.sequences[0, L:].tolist()
        margins = []
        for s in res.scores:
            top2 = torch.topk(s[0].float(), 2).values
            margins.append(float(top2[0] - top2[1]))
        print(f"[ref] len {L}: forward {t_fwd:.1f} s, generate {time.time() - t0:.1f} s, "
              f"first tokens {toks[:8]}", flush=True)
        cases.append({"len": L, "prompt": ids[0].tolist(), "generated": toks, "margins": margins})
        torch.cuda.empty_cache()
    (out / "ref.json").write_text(json.dumps({"layers": a.layers, "cases": cases}))
    if a.dtype == "both":
        bf16_reference(model, cfg, a.attn, prompts, out)


def bf16_reference(model32, cfg, attn, prompts, out):
    """The same weights in bfloat16: last-token logits of each prompt."""
    t0 = time.time()
    with torch.device("cuda"):
        model = Qwen3_5MoeForCausalLM._from_config(
            cfg, dtype=torch.bfloat16, attn_implementation=attn, experts_implementation="eager"
        ).eval()
    params = dict(model32.named_parameters())
    buffers = dict(model32.named_buffers())
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])  # bf16 already, but A_log / dt_bias (rounded, as from_pretrained does)
        for name, b in model.named_buffers():
            if name in buffers and b.is_floating_point():
                b.data = buffers[name].clone()  # RoPE inverse frequencies: float32 as computed
    kinds = sorted({str(b.dtype) for _, b in model.named_buffers()})
    print(f"[ref bf16] model built in {time.time() - t0:.1f} s (buffers {kinds})", flush=True)
    for L, ids in prompts:
        t0 = time.time()
        with torch.no_grad():
            logits = model(input_ids=ids.cuda(), logits_to_keep=1, use_cache=False).logits[0, -1].float().cpu()
        logits.numpy().astype("<f4").tofile(out / f"logits_bf16_{L}.f32")
        print(f"[ref bf16] len {L}: forward {time.time() - t0:.1f} s, top-1 {int(logits.argmax())}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
