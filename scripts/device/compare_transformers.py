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

With --fp8, OUTDIR/model is instead a block-FP8 checkpoint of those bf16
weights in the published layout (as scripts/device/fp8_checkpoint.py writes
one, through scripts/fp8_quant.py: routed experts per expert, every Linear
weight not in modules_to_not_convert as E4M3 with an f32 weight_scale_inv per
128x128 block, quantized on the GPU by transformers' Fp8Quantize, and the
quantization_config in config.json), and both references run on the
dequantized weights, bf16(f32(e4m3) * f32(scale)) as the engine computes them
(docs/FP8.md), i.e. on the engine's own bf16 weights: what the comparison
then measures is the FP8-activation prompt mode, not the weights' rounding.
ref.json says "fp8": true. Then transformers also runs OUTDIR/model as the FP8
checkpoint it is (FP8 activations, its own FP8 GEMMs, bf16 otherwise):
logits_fp8_<len>.f32, the yardstick of `--prefill-precision fp8`.

    python3 scripts/device/compare_transformers.py OUTDIR [--layers 8] [--lens 1,1024,8192] [--gen 64] [--dtype f32|both] [--fp8]

Then: qwasi verify --backend cuda --compare OUTDIR [--prefill-precision bf16].
Writes OUTDIR/model/{config.json,model.safetensors} and OUTDIR/ref.json,
OUTDIR/logits_<len>.f32 (raw little-endian float32, vocab entries) and, with
--dtype both, OUTDIR/logits_bf16_<len>.f32 (the bf16 run's logits as float32).
"""

import argparse
import json
import math
import sys
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


def dequantize(q, scale):
    """The engine's dequantization (docs/FP8.md): per 128x128 block (scale
    [row // 128, col // 128]), the E4M3 value widened to f32 times the f32 scale,
    one f32 multiply, the product rounded once to bf16 (nearest even)."""
    r, c = q.shape
    prod = q.to(torch.float32).reshape(r // 128, 128, c // 128, 128) * scale.to(torch.float32)[:, None, :, None]
    return prod.reshape(r, c).to(torch.bfloat16)


def block_rel_err(d, w):
    """max over 128x128 blocks of max |d - w| / max |w|: at most about
    16 / 448 (E4M3's half step at the top of its range, scale amax / 448) plus
    2^-8 (the product's bf16 rounding), 0.040."""
    r, c = w.shape
    amax = lambda x: x.abs().reshape(r // 128, 128, c // 128, 128).amax(dim=(1, 3))  # noqa: E731
    return float((amax(d.float() - w.float()) / amax(w.float()).clamp_min(1e-30)).max())


def fp8_checkpoint(model, tensors, layer_types, inter):
    """--fp8: the bf16 checkpoint `tensors` (CPU) as the block-FP8 checkpoint of
    scripts/device/fp8_checkpoint.py, quantized on the GPU from the model's
    parameters (which hold those bf16 values), and every quantized weight of the
    model replaced by its dequantized value, so the references compute with the
    engine's weights. Returns (the FP8 checkpoint's tensors on the CPU,
    quantization_config)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import fp8_quant as fq  # here, not at the top: the plain run stays as it was

    t0 = time.time()
    # The script's checkpoint is text-only: its names are model.layers.N..., model.embed_tokens, lm_head.
    qcfg = fq.quantization_config(layer_types, prefix="model.")
    skip = qcfg["modules_to_not_convert"]
    params = dict(model.named_parameters())
    out, n_fp8, worst = {}, 0, 0.0
    for name in list(tensors):
        v = tensors.pop(name)  # popped as it goes, so host memory holds about one checkpoint
        fused = name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))
        if not fused and not (v.ndim == 2 and fq.is_quantized(name, skip)):
            out[name] = v  # embeddings, lm_head, router, norms, conv, A_log / dt_bias: as they were
            continue
        p = params[name]
        parts = dict(fq.unfuse_experts(name, p.detach().to(torch.bfloat16), inter))  # exact: p is bf16-valued
        q, n = fq.quantize(parts, qcfg)  # on the GPU, since the parts are
        assert n == len(parts), f"{name}: {n} of {len(parts)} parts quantized"
        for key, w in parts.items():
            d = dequantize(q[key], q[key[: -len(".weight")] + ".weight_scale_inv"])
            worst = max(worst, block_rel_err(d, w))
            # Where the part sits in the parameter: unfuse_experts gives expert e's
            # gate rows [:inter], up rows [inter:] of gate_up_proj and all of down_proj.
            if key == name:
                p.copy_(d)
            else:
                e, proj = key[len(name.rsplit(".", 1)[0]) + 1:].split(".")[:2]
                rows = {"gate_proj": slice(0, inter), "up_proj": slice(inter, None), "down_proj": slice(None)}[proj]
                p[int(e), rows].copy_(d)
        out.update({k: t.cpu() for k, t in q.items()})
        n_fp8 += n
    print(f"[ref] fp8: {n_fp8} tensors quantized (E4M3, 128x128 blocks) in {time.time() - t0:.1f} s; "
          f"the references run on their dequantized values; max |dequantized - bf16| / block max |bf16| "
          f"= {worst:.4f} (E4M3 and bf16 rounding: 0.040 at most)", flush=True)
    return out, qcfg


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
    ap.add_argument(
        "--fp8",
        action="store_true",
        help="write a block-FP8 checkpoint and run the references on its dequantized weights",
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
    if a.fp8:
        with torch.no_grad():
            tensors, qcfg = fp8_checkpoint(model, tensors, cfg.layer_types, cfg.moe_intermediate_size)
    t0 = time.time()
    save_file(tensors, str(out / "model" / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    cd = text_config(a.layers)
    cd.update({"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "dtype": "bfloat16"})
    if a.fp8:
        cd["quantization_config"] = qcfg
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
    ref = {"layers": a.layers, "cases": cases}
    if a.fp8:
        ref["fp8"] = True
    (out / "ref.json").write_text(json.dumps(ref))
    if a.dtype == "both":
        bf16_reference(model, cfg, a.attn, prompts, out)
    if a.fp8:
        del model
        torch.cuda.empty_cache()
        fp8_reference(a.attn, prompts, out)


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
    last_logits(model, prompts, out, "bf16")


def last_logits(model, prompts, out, tag):
    """Each prompt's last-token logits as out/logits_<tag>_<len>.f32."""
    for L, ids in prompts:
        t0 = time.time()
        with torch.no_grad():
            logits = model(input_ids=ids.cuda(), logits_to_keep=1, use_cache=False).logits[0, -1].float().cpu()
        logits.numpy().astype("<f4").tofile(out / f"logits_{tag}_{L}.f32")
        print(f"[ref {tag}] len {L}: forward {time.time() - t0:.1f} s, top-1 {int(logits.argmax())}", flush=True)
        torch.cuda.empty_cache()


def fp8_reference(attn, prompts, out):
    """--fp8: transformers running OUTDIR/model as an FP8 checkpoint
    (`from_pretrained` with its quantization_config, bf16 otherwise: FP8Linear,
    activations quantized per token and 128 columns): last-token logits of each
    prompt as logits_fp8_<len>.f32, the yardstick of what FP8 inference itself
    loses. Where this transformers cannot run it, ref_fp8_error.txt says why."""
    t0 = time.time()
    try:
        model = Qwen3_5MoeForCausalLM.from_pretrained(
            out / "model", dtype=torch.bfloat16, device_map="cuda", attn_implementation=attn,
            experts_implementation="eager",
        ).eval()
        kinds = sorted({str(p.dtype) for p in model.parameters()})
        print(f"[ref fp8] model loaded in {time.time() - t0:.1f} s (parameters {kinds})", flush=True)
        last_logits(model, prompts, out, "fp8")
    except Exception as e:  # noqa: BLE001 - recorded, the other references stand
        (out / "ref_fp8_error.txt").write_text(repr(e)[:2000] + "\n")
        print(f"[ref fp8] not run: {e!r}"[:600], flush=True)


if __name__ == "__main__":
    main()
