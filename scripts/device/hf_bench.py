#!/usr/bin/env python3
"""transformers on exactly the engine's synthetic weights: speed and a logits cross-check.

Rebuilds, in torch on the GPU, the weights that `GpuModel::synthetic(cfg, seed)`
(host/engine/src/gpu/model.rs) generates for the `qwen3.6-35b-a3b` preset with the
seed the CLI uses (0x515741534931): the same `next_seed()` order, the same
splitmix64 `hash_uniform` (kernels/common.cu), the same f32 FMA `u * scale + offset`
(nvcc contracts it: `fma.rn.f32` in the PTX) and the same round-to-nearest-even
bf16 rounding (`f2bf`, kernels/compat.h). The fused device buffers are split back
into transformers' Qwen3_5MoeForCausalLM parameters (the (1+w) RMSNorms get
`ours - 1`, the GDN gated norm gets `ours`), then for each prompt length it measures
time to first token and greedy decode speed, and saves the last-prompt-token
logits and the greedy tokens for comparison with the engine.

Run on the GPU machine (no internet; fla-core is a pure-python wheel in .whl/):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    python3 scripts/device/hf_bench.py --lens 512,8192 --runs 3 --decode 128 --out-dir $OUT \
        [--verify-kernels .whl/common.fatbin]

(~3 min on an H200: weights 3.4 s, ~69.3 GB; the warm-up of each length includes
fla's Triton compilation; peak ~71 GB at 8192 tokens.)

    # reduced depth smoke run (the engine: `--layers 4` on the same preset):
    python3 scripts/device/hf_bench.py --layers 4 --lens 64 --runs 1 --decode 16

    # compare with the engine's dump of the same prompt's last-token logits:
    python3 scripts/device/hf_bench.py --compare-logits ours_512.f32 --hf-logits $OUT/hf_logits_512.f32
    # (or --compare-logits ours.f32 --len 512 [--out-dir DIR]; --ours-json engine.json
    #  --report hf_bench.json also compares the greedy tokens)

The bench prompt of length L is token i = 1 + (i * 1000003 + L * 7919) % (vocab - 1).
Run the engine with --ignore-eos (here eos is off: exactly --decode tokens are made).

Timing: --decode-mode generate (default) runs model.generate(do_sample=False,
max_new_tokens=N, eos off) with a streamer that timestamps each token as it reaches
the host: TTFT = first token - start, decode tok/s = (N - 1) / (last - first), the
engine's definition. --decode-mode loop runs forward + argmax by hand with the HF
cache instead. 1 warm-up + the median of --runs.

transformers picks fla's chunk_gated_delta_rule / fused_recurrent_gated_delta_rule
when `import fla` works at the time modeling_qwen3_5_moe is imported (so PYTHONPATH
must be set before the script starts), else its torch reference (and warns
"... is falling back to its reference PyTorch implementation"); the conv1d likewise
from the `causal_conv1d` package (not shipped here: the F.conv1d fallback runs). The
report says which implementation each of the four functions resolved to.

Logits: the final hidden state (bf16, after the final norm) times lm_head in f32,
so the saved logits carry no bf16 output rounding. Written as raw little-endian
float32, vocab entries, to OUT_DIR/hf_logits_<L>.f32 (OUT_DIR: --out-dir, else $OUT,
else .), the greedy tokens to OUT_DIR/hf_tokens_<L>.json.

--verify-kernels FATBIN: also run the engine's fill kernels themselves (compile
kernels/common.cu with nvcc, e.g. the PyPI one of scripts/install-gpu-toolchains.sh:
`nvcc --fatbin -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels
-o common.fatbin kernels/common.cu`) and compare every weight element, bit for bit.

--tiny: a 4-layer, hidden-64 model of the same structure on the CPU (or GPU), for
testing the generator, the mapping and the bench loop without a big GPU.
"""

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

U64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
# The seed `qwasi generate --synthetic` and `qwasi verify --synthetic` pass to GpuModel::synthetic.
ENGINE_SEED = 0x5157_4153_4931


# ---------------------------------------------------------------- geometry


@dataclass
class Geo:
    """The engine's ModelConfig fields that synthetic() and the HF config need."""

    vocab: int
    hidden: int
    layer_kinds: list  # "linear" | "full"
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    lin_k_heads: int
    lin_v_heads: int
    lin_k_dim: int
    lin_v_dim: int
    conv_kernel: int
    experts: int
    top_k: int
    inter: int
    shared: int
    eps: float = 1e-6
    max_pos: int = 262_144
    tie: bool = False
    mrope_section: list = field(default_factory=lambda: [11, 11, 10])

    @property
    def conv_dim(self):  # ModelConfig::linear_conv_dim
        return 2 * self.lin_k_heads * self.lin_k_dim + self.lin_v_heads * self.lin_v_dim

    @property
    def value_dim(self):  # ModelConfig::linear_value_dim
        return self.lin_v_heads * self.lin_v_dim


def preset(layers=40):
    """host/engine/src/presets.rs qwen36_35b_a3b(), optionally with_layers(n)."""
    assert 1 <= layers <= 40
    return Geo(
        vocab=248_320, hidden=2048,
        layer_kinds=["full" if i % 4 == 3 else "linear" for i in range(40)][:layers],
        heads=16, kv_heads=2, head_dim=256, rotary_dim=64, rope_theta=10_000_000.0,
        lin_k_heads=16, lin_v_heads=32, lin_k_dim=128, lin_v_dim=128, conv_kernel=4,
        experts=256, top_k=8, inter=512, shared=512,
    )


def tiny(layers=4):
    """Same structure, tiny widths (one attention layer at index 3)."""
    return Geo(
        vocab=512, hidden=64,
        layer_kinds=["full" if i % 4 == 3 else "linear" for i in range(layers)],
        heads=4, kv_heads=2, head_dim=32, rotary_dim=8, rope_theta=10_000_000.0,
        lin_k_heads=2, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16, conv_kernel=4,
        experts=8, top_k=2, inter=32, shared=32, mrope_section=[2, 1, 1],
    )


def hf_text_config(g: Geo):
    """Qwen3_5MoeTextConfig kwargs (as scripts/device/compare_transformers.py)."""
    return dict(
        vocab_size=g.vocab,
        hidden_size=g.hidden,
        num_hidden_layers=len(g.layer_kinds),
        layer_types=["full_attention" if k == "full" else "linear_attention" for k in g.layer_kinds],
        num_attention_heads=g.heads,
        num_key_value_heads=g.kv_heads,
        head_dim=g.head_dim,
        linear_num_key_heads=g.lin_k_heads,
        linear_num_value_heads=g.lin_v_heads,
        linear_key_head_dim=g.lin_k_dim,
        linear_value_head_dim=g.lin_v_dim,
        linear_conv_kernel_dim=g.conv_kernel,
        num_experts=g.experts,
        num_experts_per_tok=g.top_k,
        moe_intermediate_size=g.inter,
        shared_expert_intermediate_size=g.shared,
        rms_norm_eps=g.eps,
        max_position_embeddings=g.max_pos,
        tie_word_embeddings=g.tie,
        attn_output_gate=True,
        full_attention_interval=4,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": g.rope_theta,
            "partial_rotary_factor": g.rotary_dim / g.head_dim,
            "mrope_section": list(g.mrope_section),
            "mrope_interleaved": True,
        },
    )


# ---------------------------------------------------------------- pure-python references


def hash_uniform_ref(seed, i):
    """kernels/common.cu hash_uniform, exactly (the result is exact in f32)."""
    z = (seed + (i + 1) * GOLDEN) & U64
    z = ((z ^ (z >> 30)) * MIX1) & U64
    z = ((z ^ (z >> 27)) * MIX2) & U64
    z ^= z >> 31
    return (z >> 40) * 2.0**-23 - 1.0


def f32_bits(x):
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def bits_f32(b):
    return float(np.array([b], dtype=np.uint32).view(np.float32)[0])


def f2bf_ref(x):
    """kernels/compat.h f2bf on the f32 value x: bf16 bits, round to nearest even."""
    u = f32_bits(x)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return 0x7FC0
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF
    return u >> 16


def round_f32_exact(q):
    """A rational rounded to the nearest f32, ties to even (normal range)."""
    q = Fraction(q)
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    scaled = q / Fraction(2) ** (e - 23)  # in [2^23, 2^24)
    m = scaled.numerator // scaled.denominator
    rem = scaled - m
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and m % 2 == 1):
        m += 1
    return sign * float(Fraction(m) * Fraction(2) ** (e - 23))


def fma_f32_ref(a, b, c):
    """fmaf(a, b, c) for f32 inputs: exact a*b+c rounded once."""
    return round_f32_exact(Fraction(a) * Fraction(b) + Fraction(c))


def value_ref(seed, i, scale, offset):
    """fill_uniform_f32 element i (fill_uniform_bf16 is f2bf of it)."""
    return fma_f32_ref(hash_uniform_ref(seed, i), f32(scale), f32(offset))


def alog_ref(seed, i):
    """fill_alog_f32 element i, up to logf's 1 ulp (CUDA logf is not correctly rounded)."""
    u1 = hash_uniform_ref(seed, i) + 1.0  # exact in f32
    return f32(math.log(fma_f32_ref(u1, 7.5, 1.0)))


def f32(x):
    return float(np.float32(x))


def unif(cols):
    """`(3.0f32).sqrt() / (cols as f32).sqrt()` in f32."""
    return float(np.float32(np.sqrt(np.float32(3.0))) / np.float32(np.sqrt(np.float32(cols))))


EMBED_SCALE = float(np.float32(0.5) * np.float32(np.sqrt(np.float32(3.0))))  # 0.5 * 3f32.sqrt()


# ---------------------------------------------------------------- torch generator


def _srl(z, s):
    """Logical right shift of int64 tensors holding u64 bits."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _i64(x):
    x &= U64
    return x - (1 << 64) if x >> 63 else x


def hash_uniform_t(seed, start, n, device):
    """hash_uniform(seed, i) for i in [start, start + n), f32 (exact), on device."""
    z = torch.arange(start + 1, start + n + 1, dtype=torch.int64, device=device)
    z.mul_(_i64(GOLDEN)).add_(_i64(seed))  # int64 arithmetic wraps like u64
    z.bitwise_xor_(_srl(z, 30)).mul_(_i64(MIX1))
    z.bitwise_xor_(_srl(z, 27)).mul_(_i64(MIX2))
    z.bitwise_xor_(_srl(z, 31))
    t = _srl(z, 40)  # 24 bits
    del z
    return t.to(torch.float32).mul_(2.0**-23).sub_(1.0)  # exact: k * 2^-23 - 1


def values_t(kind, seed, start, n, scale, offset, device):
    """One chunk of a fill, as the f32 value the kernel computes before storing."""
    u = hash_uniform_t(seed, start, n, device)
    if kind == "alog":
        # logf(1 + 7.5 (u + 1)): u + 1 exact; fma(u+1, 7.5, 1) is exact in f64 (29 bits)
        v = u.add_(1.0).to(torch.float64).mul_(7.5).add_(1.0).to(torch.float32)
        return torch.log(v)  # on CUDA this is libdevice logf, as in the kernel
    # fma(u, scale, offset): u * scale is exact in f64 (24 x 24 bits) and, for the
    # engine's constants (offset 0, or offset 1 with scale 0.1), so is the sum (<= 51
    # bits): one rounding to f32, like the kernel's fma.rn.f32.
    v = u.to(torch.float64)
    del u
    v.mul_(scale)
    if offset != 0.0:
        v.add_(offset)
    return v.to(torch.float32)


@dataclass
class Piece:
    hf_name: str
    start: int  # element offset inside the fused device buffer
    n: int
    minus_one: bool = False  # (1+w) norms: HF holds w = ours - 1


@dataclass
class Fill:
    what: str  # the engine's buffer, for messages
    kind: str  # "bf16" (fill_uniform_bf16), "f32" (fill_uniform_f32), "alog" (fill_alog_f32)
    seed: int
    n: int
    scale: float
    offset: float
    pieces: list


def plan(g: Geo, seed=ENGINE_SEED):
    """GpuModel::synthetic's fills in next_seed() order, each split into HF parameters."""
    counter = 0

    def next_seed():
        nonlocal counter
        counter += 1
        return seed ^ ((counter * GOLDEN) & U64)

    h = g.hidden
    fills = []

    def add(what, kind, n, scale, offset, pieces):
        # next_seed() is called once per fill, in the order the code evaluates them
        fills.append(Fill(what, kind, next_seed(), n, f32(scale), f32(offset), pieces))
        assert sum(p.n for p in pieces) == n, what

    def split(prefix_rows, cols):
        """Row blocks [(hf_name, rows)] of one fused matrix -> pieces."""
        out, r = [], 0
        for name, rows in prefix_rows:
            out.append(Piece(name, r * cols, rows * cols))
            r += rows
        return out, r

    for li, kind in enumerate(g.layer_kinds):
        p = f"model.layers.{li}."
        if kind == "linear":
            a = p + "linear_attn."
            nv = g.lin_v_heads
            # a_log is launched before the DMixer::Gdn literal, then its fields in order
            add(f"L{li}.a_log", "alog", nv, 0.0, 0.0, [Piece(a + "A_log", 0, nv)])
            pieces, rows = split(
                [(a + "in_proj_qkv.weight", g.conv_dim), (a + "in_proj_z.weight", g.value_dim),
                 (a + "in_proj_a.weight", nv), (a + "in_proj_b.weight", nv)], h)
            add(f"L{li}.in_proj", "bf16", rows * h, unif(h), 0.0, pieces)
            n = g.conv_dim * g.conv_kernel
            add(f"L{li}.conv", "f32", n, 0.5, 0.0, [Piece(a + "conv1d.weight", 0, n)])
            add(f"L{li}.dt_bias", "f32", nv, 0.5, 0.0, [Piece(a + "dt_bias", 0, nv)])
            # gated norm: plain w (weights.rs GdnWeights::norm, HF RMSNormGated: weight * x)
            add(f"L{li}.gdn_norm", "f32", g.lin_v_dim, 0.1, 1.0, [Piece(a + "norm.weight", 0, g.lin_v_dim)])
            add(f"L{li}.out_proj", "bf16", h * g.value_dim, unif(g.value_dim), 0.0,
                [Piece(a + "out_proj.weight", 0, h * g.value_dim)])
        else:
            a = p + "self_attn."
            nh, nkv, hd = g.heads, g.kv_heads, g.head_dim
            pieces, rows = split(
                [(a + "q_proj.weight", 2 * nh * hd), (a + "k_proj.weight", nkv * hd),
                 (a + "v_proj.weight", nkv * hd)], h)
            add(f"L{li}.attn_proj", "bf16", rows * h, unif(h), 0.0, pieces)
            add(f"L{li}.q_norm", "f32", hd, 0.1, 1.0, [Piece(a + "q_norm.weight", 0, hd, True)])
            add(f"L{li}.k_norm", "f32", hd, 0.1, 1.0, [Piece(a + "k_norm.weight", 0, hd, True)])
            add(f"L{li}.o_proj", "bf16", h * nh * hd, unif(nh * hd), 0.0,
                [Piece(a + "o_proj.weight", 0, h * nh * hd)])
        m = p + "mlp."
        e, inter, sh = g.experts, g.inter, g.shared
        pieces, rows = split(
            [(m + "gate.weight", e), (m + "shared_expert_gate.weight", 1),
             (m + "shared_expert.gate_proj.weight", sh), (m + "shared_expert.up_proj.weight", sh)], h)
        add(f"L{li}.moe_input", "bf16", rows * h, unif(h), 0.0, pieces)
        n = e * 2 * inter * h
        add(f"L{li}.gate_up", "bf16", n, unif(h), 0.0, [Piece(m + "experts.gate_up_proj", 0, n)])
        n = e * h * inter
        add(f"L{li}.down", "bf16", n, unif(inter), 0.0, [Piece(m + "experts.down_proj", 0, n)])
        add(f"L{li}.shared_down", "bf16", h * sh, unif(sh), 0.0,
            [Piece(m + "shared_expert.down_proj.weight", 0, h * sh)])
        # DLayer literal: input_norm, post_norm (mixer and mlp were built above)
        add(f"L{li}.input_norm", "f32", h, 0.1, 1.0, [Piece(p + "input_layernorm.weight", 0, h, True)])
        add(f"L{li}.post_norm", "f32", h, 0.1, 1.0, [Piece(p + "post_attention_layernorm.weight", 0, h, True)])
    n = g.vocab * h
    add("embed", "bf16", n, EMBED_SCALE, 0.0, [Piece("model.embed_tokens.weight", 0, n)])
    if not g.tie:
        add("lm_head", "bf16", n, unif(h), 0.0, [Piece("lm_head.weight", 0, n)])
    add("norm", "f32", h, 0.1, 1.0, [Piece("model.norm.weight", 0, h, True)])
    return fills


def fill_model(model, g: Geo, seed=ENGINE_SEED, chunk=1 << 26, keep_f32=False, log=None):
    """Writes every parameter of `model` from the plan; returns (filled names, elements).

    keep_f32: parameters the engine keeps in f32 (norms, conv, A_log, dt_bias) are
    replaced by f32 parameters, so HF multiplies by exactly the engine's values;
    otherwise they are rounded (RNE) to the model's dtype, as a bf16 load would."""
    params = dict(model.named_parameters())
    filled = {}
    fills = plan(g, seed)
    t0 = time.time()
    total = 0
    for fi, f in enumerate(fills):
        for pc in f.pieces:
            if pc.hf_name not in params:
                raise KeyError(f"{f.what}: no parameter {pc.hf_name}")
            if pc.hf_name in filled:
                raise RuntimeError(f"{pc.hf_name} filled twice")
            prm = params[pc.hf_name]
            if prm.numel() != pc.n:
                raise RuntimeError(f"{pc.hf_name}: {prm.numel()} elements, plan has {pc.n} ({f.what})")
            if keep_f32 and f.kind != "bf16" and prm.dtype != torch.float32:
                mod_name, _, attr = pc.hf_name.rpartition(".")
                mod = model.get_submodule(mod_name)
                new = torch.nn.Parameter(torch.empty(prm.shape, dtype=torch.float32, device=prm.device),
                                         requires_grad=False)
                setattr(mod, attr, new)
                params[pc.hf_name] = prm = new
            flat = prm.data.view(-1)
            assert prm.data.is_contiguous()
            for a in range(0, pc.n, chunk):
                b = min(pc.n, a + chunk)
                v = values_t(f.kind, f.seed, pc.start + a, b - a, f.scale, f.offset, prm.device)
                if f.kind == "bf16":
                    v = v.to(torch.bfloat16)  # f2bf: round to nearest even
                elif pc.minus_one:
                    v.sub_(1.0)  # exact: v in [0.9, 1.1] (Sterbenz)
                flat[a:b].copy_(v)
                del v
            filled[pc.hf_name] = pc.n
            total += pc.n
        if log and (fi + 1) % 50 == 0:
            log(f"[gen] {fi + 1}/{len(fills)} fills, {total / 1e9:.2f} G elements, {time.time() - t0:.1f} s")
    missing = [n for n in params if n not in filled]
    if missing:
        raise RuntimeError(f"{len(missing)} parameters not filled: {missing[:8]}")
    assert len(filled) == len(list(model.parameters())), (len(filled), len(list(model.parameters())))
    return filled, total


def reset_buffers(model, device):
    """to_empty() leaves buffers uninitialised: recompute the rotary inv_freq."""
    done = set()
    for name, mod in model.named_modules():
        if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
            fresh = type(mod)(mod.config)  # computes its buffers on the CPU
            for bname, buf in fresh.named_buffers(recurse=False):
                getattr(mod, bname).data = buf.to(device)
                done.add(f"{name}.{bname}" if name else bname)
    left = [n for n, _ in model.named_buffers() if n not in done]
    if left:
        raise RuntimeError(f"buffers not initialised after to_empty: {left}")
    return sorted(done)


def build_model(g: Geo, device, dtype, attn="sdpa", experts=None):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    cfg = Qwen3_5MoeTextConfig(**hf_text_config(g))
    kw = dict(dtype=dtype, attn_implementation=attn)
    if experts:
        kw["experts_implementation"] = experts
    with torch.device("meta"):
        model = Qwen3_5MoeForCausalLM._from_config(cfg, **kw)
    model = model.to_empty(device=device)
    reset_buffers(model, device)
    model.eval()
    model.requires_grad_(False)
    return model


def build_filled(g: Geo, device, dtype, seed=ENGINE_SEED, keep_f32=False, chunk=1 << 26,
                 attn="sdpa", experts=None, log=None):
    model = build_model(g, device, dtype, attn, experts)
    with torch.no_grad():
        filled, total = fill_model(model, g, seed, chunk=chunk, keep_f32=keep_f32, log=log)
    return model, filled, total


# ---------------------------------------------------------------- which kernels


def kernel_report():
    """Which implementation transformers bound for the GDN and conv functions."""
    import transformers.models.qwen3_5_moe.modeling_qwen3_5_moe as mq

    out = {}
    for fn in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
               "causal_conv1d_fn", "causal_conv1d_update"):
        f = getattr(mq, fn, None)
        impl = None
        cl = dict(zip(getattr(getattr(f, "__code__", None), "co_freevars", ()), getattr(f, "__closure__", None) or ()))
        if "implementation" in cl:
            try:
                impl = cl["implementation"].cell_contents
            except ValueError:
                impl = None
        if impl is None:
            out[fn] = "unknown"
        else:
            out[fn] = f"{impl.__module__}.{impl.__name__}"
    return out


def versions():
    import transformers

    v = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    for mod in ("fla", "triton", "causal_conv1d", "kernels"):
        try:
            m = __import__(mod)
            v[mod] = getattr(m, "__version__", "?")
        except Exception as e:  # noqa: BLE001 - report, never fail
            v[mod] = None if isinstance(e, ModuleNotFoundError) else f"import failed: {e!r}"[:200]
    v["cuda"] = torch.version.cuda
    return v


# ---------------------------------------------------------------- self-check


def self_check(device, seeds=None, n=256):
    """The torch generator against the pure-python reference on `device` (GPU int64
    wrap-around, logical shifts, FMA emulation, RNE rounding); raises on mismatch."""
    g = preset()
    fills = plan(g)
    seeds = seeds or [ENGINE_SEED, 0, U64, fills[0].seed, fills[-1].seed]
    starts = [0, 12_345_678, (1 << 32) - 100, 536_870_912 - n]  # the last: the expert tensors' end
    cases = [("bf16", unif(2048), 0.0), ("f32", 0.5, 0.0), ("f32", 0.1, 1.0), ("bf16", EMBED_SCALE, 0.0),
             ("bf16", unif(512), 0.0)]
    bad = 0
    for s in seeds:
        for st in starts:
            u = hash_uniform_t(s, st, n, device).cpu().tolist()
            for k in range(0, n, 7):
                if u[k] != hash_uniform_ref(s, st + k):
                    bad += 1
            for kind, sc, off in cases:
                v = values_t(kind, s, st, 64, f32(sc), f32(off), device)
                if kind == "bf16":
                    got = v.to(torch.bfloat16).view(torch.int16).cpu().numpy().astype(np.uint16).tolist()
                    want = [f2bf_ref(value_ref(s, st + k, sc, off)) for k in range(64)]
                else:
                    got = v.cpu().tolist()
                    want = [value_ref(s, st + k, sc, off) for k in range(64)]
                bad += sum(a != b for a, b in zip(got, want))
            la = values_t("alog", s, st, 64, 0.0, 0.0, device).cpu().numpy()
            lr = np.array([alog_ref(s, st + k) for k in range(64)], dtype=np.float32)
            ulps = np.abs(la.view(np.int32).astype(np.int64) - lr.view(np.int32).astype(np.int64))
            bad += int((ulps > 1).sum())
    if bad:
        raise RuntimeError(f"generator self-check on {device}: {bad} mismatches")
    return True


# ---------------------------------------------------------------- the engine's own kernels


def verify_against_kernels(model, g: Geo, seed, fatbin, log=print):
    """Runs the engine's fill kernels (a fatbin of kernels/common.cu) with synthetic()'s
    arguments and launch shapes, fill by fill, and compares every element with the
    HF parameters (bf16 bits; f32 values, +1 for the (1+w) norms). Returns mismatches."""
    import ctypes

    torch.zeros(1, device="cuda")  # the primary context, current on this thread
    cu = ctypes.CDLL("libcuda.so.1")
    vp, u32 = ctypes.c_void_p, ctypes.c_uint
    cu.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
    cu.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
    cu.cuLaunchKernel.argtypes = [vp, u32, u32, u32, u32, u32, u32, u32, vp, ctypes.POINTER(vp), vp]
    image = Path(fatbin).read_bytes()
    mod = vp()
    r = cu.cuModuleLoadData(ctypes.byref(mod), image)
    if r != 0:
        raise RuntimeError(f"cuModuleLoadData({fatbin}) = {r}")
    fns = {}
    for name in ("fill_uniform_bf16", "fill_uniform_f32", "fill_alog_f32"):
        f = vp()
        if cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()) != 0:
            raise RuntimeError(f"{name} not in {fatbin}")
        fns[name] = f

    def launch(name, grid, args):
        ptrs = (vp * len(args))(*[ctypes.cast(ctypes.pointer(a), vp) for a in args])
        r = cu.cuLaunchKernel(fns[name], grid, 1, 1, 256, 1, 1, 0, None, ptrs, None)
        if r != 0:
            raise RuntimeError(f"cuLaunchKernel({name}) = {r}")

    params = dict(model.named_parameters())
    bad = checked = 0
    torch.cuda.synchronize()
    for f in plan(g, seed):
        dt = torch.bfloat16 if f.kind == "bf16" else torch.float32
        buf = torch.empty(f.n, dtype=dt, device="cuda")
        ptr, n, s = ctypes.c_uint64(buf.data_ptr()), ctypes.c_int64(f.n), ctypes.c_uint64(f.seed)
        if f.kind == "alog":
            launch("fill_alog_f32", (f.n + 255) // 256, [ptr, n, s])
        else:
            blocks = min((f.n + 255) // 256, 65_535 * 16)
            name = "fill_uniform_bf16" if f.kind == "bf16" else "fill_uniform_f32"
            launch(name, blocks, [ptr, n, s, ctypes.c_float(f.scale), ctypes.c_float(f.offset)])
        torch.cuda.synchronize()
        for pc in f.pieces:
            ours = buf[pc.start:pc.start + pc.n]
            hf = params[pc.hf_name].data.view(-1)
            if f.kind == "bf16":
                nbad = int((hf.view(torch.int16) != ours.view(torch.int16)).sum())
            else:
                want = ours - 1.0 if pc.minus_one else ours
                if hf.dtype == torch.float32:
                    nbad = int((hf.view(torch.int32) != want.view(torch.int32)).sum())
                else:
                    nbad = int((hf.view(torch.int16) != want.to(hf.dtype).view(torch.int16)).sum())
            if nbad:
                log(f"[kernels] {pc.hf_name} ({f.what}): {nbad} of {pc.n} elements differ")
            bad += nbad
            checked += pc.n
        del buf
    log(f"[kernels] {checked / 1e9:.3f} G elements compared with the engine's fill kernels: {bad} differ")
    return bad


# ---------------------------------------------------------------- benchmark


def prompt_ids(L, vocab):
    return [1 + (i * 1_000_003 + L * 7919) % (vocab - 1) for i in range(L)]


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_generate(model, ids, n, device):
    from transformers import GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self):
            self.t, self.toks, self.prompt_seen = [], [], False

        def put(self, value):
            if not self.prompt_seen:  # generate() first pushes the prompt
                self.prompt_seen = True
                return
            self.t.append(time.perf_counter())  # the token is on the host already (.cpu())
            self.toks.extend(int(x) for x in value.reshape(-1).tolist())

        def end(self):
            pass

    gc = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                          pad_token_id=0, bos_token_id=None, temperature=None, top_p=None, top_k=None)
    st = Stamps()
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        seq = model.generate(ids, generation_config=gc, streamer=st)
    _sync(device)
    t1 = time.perf_counter()
    toks = seq[0, ids.shape[1]:].tolist()
    assert len(toks) == n, (len(toks), n)
    assert st.toks == toks, "streamer tokens differ from generate's output"
    ttft = st.t[0] - t0
    dec = (n - 1) / (st.t[-1] - st.t[0]) if n > 1 else float("nan")
    return ttft, dec, toks, t1 - t0


def run_loop(model, ids, n, device):
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        toks = [int(tok.item())]
        t1 = time.perf_counter()
        cache = out.past_key_values
        for _ in range(n - 1):
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(int(tok.item()))
    _sync(device)
    t2 = time.perf_counter()
    dec = (n - 1) / (t2 - t1) if n > 1 else float("nan")
    return t1 - t0, dec, toks, t2 - t0


def last_logits_f32(model, ids):
    """Last prompt token's logits: HF's final hidden state (after the norm) x lm_head in f32."""
    with torch.no_grad():
        hid = model.model(input_ids=ids, use_cache=False).last_hidden_state[0, -1]
        w = model.lm_head.weight
        out = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
        step = 1 << 15
        for a in range(0, w.shape[0], step):
            out[a:a + step] = w[a:a + step].float() @ hid.float()
    return out


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "all": xs}


def bench(model, g, lens, runs, n_decode, device, mode, out_dir, save_logits, log):
    cases = []
    runner = run_generate if mode == "generate" else run_loop
    for L in lens:
        ids = torch.tensor([prompt_ids(L, g.vocab)], dtype=torch.long, device=device)
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        case = {"len": L, "prompt_head": ids[0, :8].tolist()}
        if save_logits:
            lg = last_logits_f32(model, ids)
            path = Path(out_dir) / f"hf_logits_{L}.f32"
            lg.cpu().numpy().astype("<f4").tofile(path)
            top = torch.topk(lg, 2)
            case.update(logits_file=str(path), logits_argmax=int(top.indices[0]),
                        logits_top1_margin=float(top.values[0] - top.values[1]),
                        logits_finite=bool(torch.isfinite(lg).all()))
        ttfts, decs, walls, toks0 = [], [], [], None
        for r in range(runs + 1):
            ttft, dec, toks, wall = runner(model, ids, n_decode, device)
            tag = "warm-up" if r == 0 else f"run {r}"
            log(f"[bench] L={L} {tag}: ttft {ttft * 1e3:.1f} ms, decode {dec:.2f} tok/s, wall {wall:.2f} s")
            if r == 0:
                toks0 = toks
                continue
            same = compare_tokens(toks0, toks)["common_prefix"]
            case.setdefault("runs_common_prefix_with_warmup", []).append(same)
            if toks != toks0:
                log(f"[bench] L={L}: greedy tokens leave the warm-up's after {same} "
                    "(bf16 kernels are not bitwise deterministic; random weights have small margins)")
            ttfts.append(ttft)
            decs.append(dec)
            walls.append(wall)
        case.update(ttft_s=stats(ttfts), decode_tok_s=stats(decs), wall_s=stats(walls),
                    decode_tokens=n_decode, greedy_first16=toks0[:16], greedy=toks0)
        if torch.device(device).type == "cuda":
            case["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
        (Path(out_dir) / f"hf_tokens_{L}.json").write_text(json.dumps({"len": L, "tokens": toks0}) + "\n")
        cases.append(case)
    return cases


# ---------------------------------------------------------------- comparison


def compare_logits(hf_path, ours_path, topk=8):
    a = np.fromfile(hf_path, dtype="<f4").astype(np.float64)
    b = np.fromfile(ours_path, dtype="<f4").astype(np.float64)
    if a.shape != b.shape:
        raise SystemExit(f"size mismatch: {hf_path} has {a.size} entries, {ours_path} {b.size}")
    la = a - (a.max() + np.log(np.exp(a - a.max()).sum()))
    lb = b - (b.max() + np.log(np.exp(b - b.max()).sum()))
    pa = np.exp(la)
    kl = float((pa * (la - lb)).sum())
    ta, tb = np.argsort(-a)[:topk], np.argsort(-b)[:topk]
    return {
        "kl_hf_ours": kl,
        "top1_agree": bool(ta[0] == tb[0]),
        "hf_top1": int(ta[0]),
        "ours_top1": int(tb[0]),
        "hf_top1_margin": float(a[ta[0]] - a[ta[1]]),
        "topk_overlap": len(set(ta.tolist()) & set(tb.tolist())),
        "max_abs_dlogprob_hf_topk": float(np.abs(la[ta] - lb[ta]).max()),
        "max_abs_dlogit": float(np.abs(a - b).max()),
        "finite": bool(np.isfinite(a).all() and np.isfinite(b).all()),
    }


def compare_tokens(hf_toks, ours_toks):
    n = 0
    for x, y in zip(hf_toks, ours_toks):
        if x != y:
            break
        n += 1
    return {"common_prefix": n, "compared": min(len(hf_toks), len(ours_toks))}


def compare_main(a):
    ours = Path(a.compare_logits)
    if a.hf_logits:
        hf = Path(a.hf_logits)
    else:
        if a.len is None:
            raise SystemExit("--compare-logits needs --hf-logits PATH or --len L")
        hf = Path(out_dir_of(a)) / f"hf_logits_{a.len}.f32"
    r = compare_logits(hf, ours)
    r.update(hf=str(hf), ours=str(ours))
    if a.ours_json:
        ours_toks = json.loads(Path(a.ours_json).read_text())["tokens"]
        L = a.len
        if a.report:
            rep = json.loads(Path(a.report).read_text())
            cs = [c for c in rep["cases"] if L is None or c["len"] == L]
            if not cs:
                raise SystemExit(f"no case for len {L} in {a.report}")
            hf_toks = cs[0]["greedy"]
        else:
            hf_toks = json.loads((Path(out_dir_of(a)) / f"hf_tokens_{L}.json").read_text())["tokens"]
        r["tokens"] = compare_tokens(hf_toks, ours_toks)
    print(f"KL(hf||ours) = {r['kl_hf_ours']:.3e}   top-1 {'agree' if r['top1_agree'] else 'DIFFER'} "
          f"(hf {r['hf_top1']} margin {r['hf_top1_margin']:.3f}, ours {r['ours_top1']})   "
          f"top-8 overlap {r['topk_overlap']}/8   max |dlogprob| over hf top-8 {r['max_abs_dlogprob_hf_topk']:.3e}   "
          f"max |dlogit| {r['max_abs_dlogit']:.3e}")
    if "tokens" in r:
        t = r["tokens"]
        print(f"greedy tokens: identical for the first {t['common_prefix']} of {t['compared']}")
    print(json.dumps(r))
    return r


# ---------------------------------------------------------------- main


def out_dir_of(a):
    return a.out_dir or os.environ.get("OUT") or "."


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lens", default="512,8192")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--layers", type=int, default=None, help="first N layers (the engine's --layers)")
    ap.add_argument("--tiny", action="store_true", help="4-layer hidden-64 model (CPU unless CUDA is there)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--keep-f32", action="store_true",
                    help="keep norms/conv/A_log/dt_bias in f32 (the engine's exact values) instead of the model dtype")
    ap.add_argument("--seed", type=lambda s: int(s, 0), default=ENGINE_SEED)
    ap.add_argument("--decode-mode", default="generate", choices=["generate", "loop"])
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--experts", default=None, help="experts_implementation (default: transformers' choice)")
    ap.add_argument("--chunk", type=int, default=1 << 26, help="elements generated per step")
    ap.add_argument("--no-logits", action="store_true")
    ap.add_argument("--out-dir", default=None, help="logits/tokens directory (default $OUT, else .)")
    ap.add_argument("--json", default=None, help="report path (default OUT_DIR/hf_bench.json)")
    ap.add_argument("--skip-self-check", action="store_true")
    ap.add_argument("--verify-kernels", default=None, metavar="FATBIN",
                    help="compare every weight with the engine's own fill kernels (a fatbin of kernels/common.cu)")
    ap.add_argument("--compare-logits", default=None, metavar="OURS.f32",
                    help="only compare: KL(hf||ours) and top-1 against --hf-logits or OUT_DIR/hf_logits_<--len>.f32")
    ap.add_argument("--hf-logits", default=None)
    ap.add_argument("--len", type=int, default=None)
    ap.add_argument("--ours-json", default=None, help="engine `generate --json` output: compare its tokens")
    ap.add_argument("--report", default=None, help="hf_bench.json to take HF's tokens from")
    a = ap.parse_args(argv)

    if a.compare_logits:
        return compare_main(a)

    def log(msg):
        print(msg, flush=True)

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    g = tiny(a.layers or 4) if a.tiny else preset(a.layers or 40)
    dtype = getattr(torch, a.dtype)
    out_dir = Path(out_dir_of(a))
    out_dir.mkdir(parents=True, exist_ok=True)
    lens = [int(x) for x in a.lens.split(",") if x]

    if not a.skip_self_check:
        t0 = time.time()
        self_check(device)
        log(f"[check] generator matches the python reference on {device} ({time.time() - t0:.1f} s)")

    import transformers  # noqa: F401  (after PYTHONPATH; binds fla at import of the model module)

    kernels = kernel_report()
    fla_active = kernels["torch_chunk_gated_delta_rule"].startswith("fla.")
    log(f"[hf] transformers {transformers.__version__}, torch {torch.__version__}; kernels: {kernels}")
    if not fla_active:
        log("[hf] WARNING: fla not active: the GDN runs transformers' torch reference (much slower)")

    t0 = time.time()
    model, filled, total = build_filled(g, device, dtype, a.seed, keep_f32=a.keep_f32, chunk=a.chunk,
                                        attn=a.attn, experts=a.experts, log=log)
    _sync(device)
    gen_s = time.time() - t0
    nparams = len(list(model.parameters()))
    log(f"[gen] {len(g.layer_kinds)} layers: {len(filled)}/{nparams} parameters filled, "
        f"{total / 1e9:.3f} G elements in {gen_s:.1f} s")
    mem_w = torch.cuda.memory_allocated() if torch.device(device).type == "cuda" else None
    kernel_mismatches = None
    if a.verify_kernels:
        kernel_mismatches = verify_against_kernels(model, g, a.seed, a.verify_kernels, log=log)
        if kernel_mismatches:
            raise SystemExit(f"{kernel_mismatches} weights differ from the engine's kernels")

    cases = bench(model, g, lens, a.runs, a.decode, device, a.decode_mode, out_dir, not a.no_logits, log)
    report = {
        "preset": "tiny" if a.tiny else "qwen3.6-35b-a3b",
        "layers": len(g.layer_kinds),
        "seed": hex(a.seed),
        "dtype": a.dtype,
        "keep_f32": a.keep_f32,
        "attn_implementation": model.config._attn_implementation,
        "experts_implementation": getattr(model.config, "_experts_implementation", None),
        "decode_mode": a.decode_mode,
        "runs": a.runs,
        "fla_active": fla_active,
        "kernels": kernels,
        "versions": versions(),
        "device": torch.cuda.get_device_name() if torch.device(device).type == "cuda" else platform.processor(),
        "params_filled": len(filled),
        "params_total": nparams,
        "elements": total,
        "gen_weights_s": gen_s,
        "mem_after_weights_bytes": mem_w,
        "kernel_check_mismatches": kernel_mismatches,
        "cases": cases,
    }
    jpath = Path(a.json) if a.json else out_dir / "hf_bench.json"
    jpath.write_text(json.dumps(report, indent=1) + "\n")
    log(f"\ntransformers {report['versions']['transformers']} / torch {report['versions']['torch']}, "
        f"{report['device']}, {report['layers']} layers, {a.dtype}, attn {report['attn_implementation']}, "
        f"experts {report['experts_implementation']}, fla {'ON' if fla_active else 'off'}, decode via {a.decode_mode}")
    log(f"{'len':>6} {'TTFT ms (med/min/max)':>26} {'decode tok/s (med/min/max)':>30} {'peak GB':>8}  first tokens")
    for c in cases:
        t, d = c["ttft_s"], c["decode_tok_s"]
        pk = c.get("peak_mem_bytes")
        log(f"{c['len']:>6} {t['median'] * 1e3:>9.1f}/{t['min'] * 1e3:.1f}/{t['max'] * 1e3:.1f}"
            f" {d['median']:>14.2f}/{d['min']:.2f}/{d['max']:.2f}"
            f" {pk / 1e9 if pk else float('nan'):>8.1f}  {c['greedy_first16'][:8]}")
    log(f"report: {jpath}")
    return report


if __name__ == "__main__":
    main()
