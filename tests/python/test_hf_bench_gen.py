"""scripts/device/hf_bench.py on the CPU: the torch copy of the engine's synthetic-weight
generator (kernels/common.cu hash_uniform + fill_*, compat.h f2bf) against bit-level
pure-Python references, and the mapping of GpuModel::synthetic's fused buffers onto
transformers' Qwen3_5MoeForCausalLM parameters.

Needs torch, numpy and transformers (5.17); no GPU. Run: python3 -m pytest tests/python -q
"""

import importlib.util
import random
import struct
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("hf_bench", ROOT / "scripts" / "device" / "hf_bench.py")
hb = importlib.util.module_from_spec(_spec)
sys.modules["hf_bench"] = hb
_spec.loader.exec_module(hb)

SEEDS = [hb.ENGINE_SEED, 0, 1, (1 << 64) - 1, 0x8000_0000_0000_0000, 0xDEAD_BEEF_CAFE_F00D]


def seeds_of_plan():
    fills = hb.plan(hb.preset())
    return [fills[0].seed, fills[1].seed, fills[-2].seed, fills[-1].seed]


# ---------------------------------------------------------------- (a) hash


def test_hash_reference_known_values():
    # hand-checked splitmix64 finaliser: index 0, seed 0 hashes GOLDEN * 1
    z = hb.GOLDEN
    z = ((z ^ (z >> 30)) * hb.MIX1) & hb.U64
    z = ((z ^ (z >> 27)) * hb.MIX2) & hb.U64
    z ^= z >> 31
    assert hb.hash_uniform_ref(0, 0) == (z >> 40) / 8388608.0 - 1.0
    # splitmix64's well-known first output for state 0 is 0xE220A8397B1DCDAF
    assert z == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("seed", SEEDS + seeds_of_plan())
def test_hash_torch_matches_reference(seed):
    for start in [0, 1000, (1 << 31) - 7, (1 << 32) + 3, 536_870_912 - 300, (1 << 40) + 11]:
        n = 300
        got = hb.hash_uniform_t(seed, start, n, "cpu")
        assert got.dtype == torch.float32
        want = [hb.hash_uniform_ref(seed, start + i) for i in range(n)]
        assert got.tolist() == want
        assert all(-1.0 <= w < 1.0 for w in want)


def test_hash_values_are_exact_in_f32():
    for i in range(200):
        v = hb.hash_uniform_ref(hb.ENGINE_SEED, i)
        assert float(np.float32(v)) == v


def test_seed_sequence_matches_rust_closure():
    # next_seed(): counter += 1; seed ^ counter.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    fills = hb.plan(hb.preset())
    for k, f in enumerate(fills, start=1):
        assert f.seed == hb.ENGINE_SEED ^ ((k * 0x9E3779B97F4A7C15) % (1 << 64))


# ---------------------------------------------------------------- (b) rounding


def test_f2bf_reference_ties_and_specials():
    f = hb.bits_f32
    assert hb.f2bf_ref(f(0x3F808000)) == 0x3F80  # tie, even stays
    assert hb.f2bf_ref(f(0x3F818000)) == 0x3F82  # tie, odd rounds up
    assert hb.f2bf_ref(f(0x3F808001)) == 0x3F81
    assert hb.f2bf_ref(f(0x3F807FFF)) == 0x3F80
    assert hb.f2bf_ref(f(0xBF818000)) == 0xBF82
    assert hb.f2bf_ref(f(0x7F7FFFFF)) == 0x7F80  # rounds to inf, like the kernel
    assert hb.f2bf_ref(float("inf")) == 0x7F80
    assert hb.f2bf_ref(float("nan")) == 0x7FC0


def _torch_bf16_bits(values):
    t = torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)
    return t.view(torch.int16).numpy().astype(np.uint16).tolist()


def test_torch_bf16_cast_is_f2bf():
    rng = random.Random(7)
    bits = [rng.getrandbits(32) for _ in range(20000)]
    # force many exact ties and near-ties, both parities
    bits += [(b & 0xFFFF0000) | 0x8000 for b in bits[:4000]]
    bits += [(b & 0xFFFF0000) | 0x7FFF for b in bits[:2000]]
    bits += [(b & 0xFFFF0000) | 0x8001 for b in bits[:2000]]
    vals = [hb.bits_f32(b) for b in bits]
    vals = [v for v in vals if v == v]  # NaN payloads: the kernel's quiet NaN differs by design
    assert _torch_bf16_bits(vals) == [hb.f2bf_ref(v) for v in vals]


def test_generated_bf16_values_match_f2bf_of_fma():
    for seed in [hb.ENGINE_SEED] + seeds_of_plan():
        for scale in [hb.unif(2048), hb.unif(512), hb.unif(4096), hb.EMBED_SCALE, 0.5]:
            v = hb.values_t("bf16", seed, 12345, 300, hb.f32(scale), 0.0, "cpu")
            got = _torch_bf16_bits(v.tolist())
            want = [hb.f2bf_ref(hb.value_ref(seed, 12345 + i, scale, 0.0)) for i in range(300)]
            assert got == want


def test_fma_emulation_offset_one():
    # the norms: fma(u, 0.1f, 1.0f) rounded once (nvcc emits fma.rn.f32)
    for seed in SEEDS:
        v = hb.values_t("f32", seed, 0, 400, hb.f32(0.1), 1.0, "cpu").tolist()
        want = [hb.value_ref(seed, i, 0.1, 1.0) for i in range(400)]
        assert v == want
        assert all(0.9 - 1e-6 <= x <= 1.1 + 1e-6 for x in v)


def test_round_f32_exact_against_numpy():
    rng = random.Random(3)
    for _ in range(5000):
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if not np.isfinite(x) or x == 0 or not (1e-30 < abs(x) < 1e30):
            continue
        assert hb.round_f32_exact(Fraction(x)) == float(np.float32(x))


def test_alog_within_one_ulp():
    for seed in SEEDS[:3]:
        got = hb.values_t("alog", seed, 0, 64, 0.0, 0.0, "cpu").numpy()
        want = np.array([hb.alog_ref(seed, i) for i in range(64)], dtype=np.float32)
        ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
        assert ulps.max() <= 1
        assert (got > 0).all() and (got < np.log(16.0) + 1e-6).all()


def test_unif_scales_are_f32():
    assert hb.unif(2048) == float(np.float32(np.float32(np.sqrt(np.float32(3))) / np.float32(np.sqrt(np.float32(2048)))))
    assert hb.EMBED_SCALE == float(np.float32(0.5) * np.float32(np.sqrt(np.float32(3))))


def test_self_check_cpu():
    assert hb.self_check("cpu", n=64)


# ---------------------------------------------------------------- (c) mapping


def test_plan_covers_full_preset_on_meta():
    """Every parameter of the 40-layer HF model gets exactly one piece of matching size."""
    g = hb.preset()
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    with torch.device("meta"):
        m = Qwen3_5MoeForCausalLM._from_config(Qwen3_5MoeTextConfig(**hb.hf_text_config(g)), dtype=torch.bfloat16)
    params = dict(m.named_parameters())
    fills = hb.plan(g)
    names = [p.hf_name for f in fills for p in f.pieces]
    assert len(names) == len(set(names))
    assert set(names) == set(params)
    assert len(names) == len(list(m.parameters()))
    for f in fills:
        off = 0
        for p in f.pieces:
            assert p.start == off
            assert params[p.hf_name].numel() == p.n
            off += p.n
        assert off == f.n
    # 30 GDN layers x 6 fills + 10 attention x 4 + 40 x (4 MoE + 2 norms) + embed, lm_head, norm
    assert len(fills) == 30 * 6 + 10 * 4 + 40 * 6 + 3
    # MODEL.md: 693 language tensors (HF keeps q/k/v, in_proj_* and the shared expert apart)
    assert len(params) == 693
    total = sum(f.n for f in fills)
    assert total == sum(p.numel() for p in params.values())
    # MODEL.md: 69,321,221,376 bytes of BF16 language tensors
    assert 2 * total == 69_321_221_376


@pytest.fixture(scope="module")
def tiny_model():
    g = hb.tiny()
    model, filled, total = hb.build_filled(g, "cpu", torch.float32, chunk=1000)
    return g, model, filled, total


def test_tiny_fills_every_parameter(tiny_model):
    g, model, filled, total = tiny_model
    assert len(filled) == len(list(model.parameters())) == len(dict(model.named_parameters()))
    assert total == sum(p.numel() for p in model.parameters())
    for name, buf in model.named_buffers():
        assert torch.isfinite(buf).all(), name
    ref = type(model.model.rotary_emb)(model.config)
    assert torch.equal(model.model.rotary_emb.inv_freq, ref.inv_freq)


def _bf16_value(seed, i, scale):
    bits = hb.f2bf_ref(hb.value_ref(seed, i, scale, 0.0))
    return hb.bits_f32(bits << 16)


def test_tiny_values_land_in_the_right_places(tiny_model):
    g, model, _, _ = tiny_model
    p = dict(model.named_parameters())
    fills = {f.what: f for f in hb.plan(g)}
    h = g.hidden

    def fused(what, row, col, cols):
        f = fills[what]
        return _bf16_value(f.seed, row * cols + col, f.scale)

    # GDN in_proj rows: [qkv | z | a | b]
    f = "L0.in_proj"
    assert p["model.layers.0.linear_attn.in_proj_qkv.weight"][5, 7].item() == fused(f, 5, 7, h)
    assert p["model.layers.0.linear_attn.in_proj_z.weight"][2, 3].item() == fused(f, g.conv_dim + 2, 3, h)
    assert p["model.layers.0.linear_attn.in_proj_a.weight"][1, 0].item() == fused(f, g.conv_dim + g.value_dim + 1, 0, h)
    r = g.conv_dim + g.value_dim + g.lin_v_heads + 3
    assert p["model.layers.0.linear_attn.in_proj_b.weight"][3, 9].item() == fused(f, r, 9, h)
    # conv [conv_dim * K] = conv1d.weight [conv_dim, 1, K]
    c = fills["L0.conv"]
    assert p["model.layers.0.linear_attn.conv1d.weight"][6, 0, 2].item() == hb.value_ref(c.seed, 6 * 4 + 2, 0.5, 0.0)
    # A_log, dt_bias kept as f32 values; the GDN norm is plain w
    a = fills["L1.a_log"]
    assert p["model.layers.1.linear_attn.A_log"][3].item() == pytest.approx(hb.alog_ref(a.seed, 3), rel=2e-7)
    d = fills["L1.dt_bias"]
    assert p["model.layers.1.linear_attn.dt_bias"][2].item() == hb.value_ref(d.seed, 2, 0.5, 0.0)
    n = fills["L2.gdn_norm"]
    assert p["model.layers.2.linear_attn.norm.weight"][5].item() == hb.value_ref(n.seed, 5, 0.1, 1.0)
    # attention proj rows: [q_proj (per head query|gate) ; k_proj ; v_proj]
    f, nq, nk = "L3.attn_proj", 2 * g.heads * g.head_dim, g.kv_heads * g.head_dim
    assert p["model.layers.3.self_attn.q_proj.weight"][nq - 1, 4].item() == fused(f, nq - 1, 4, h)
    assert p["model.layers.3.self_attn.k_proj.weight"][0, 0].item() == fused(f, nq, 0, h)
    assert p["model.layers.3.self_attn.v_proj.weight"][7, 1].item() == fused(f, nq + nk + 7, 1, h)
    o = fills["L3.o_proj"]
    assert p["model.layers.3.self_attn.o_proj.weight"][1, 2].item() == fused("L3.o_proj", 1, 2, g.heads * g.head_dim)
    assert o.scale == hb.unif(g.heads * g.head_dim)
    # (1+w) norms: HF's w = ours - 1 (exact in f32)
    q = fills["L3.q_norm"]
    assert p["model.layers.3.self_attn.q_norm.weight"][4].item() + 1.0 == hb.value_ref(q.seed, 4, 0.1, 1.0)
    nn_ = fills["L2.post_norm"]
    assert p["model.layers.2.post_attention_layernorm.weight"][9].item() + 1.0 == hb.value_ref(nn_.seed, 9, 0.1, 1.0)
    fn = fills["norm"]
    assert p["model.norm.weight"][0].item() + 1.0 == hb.value_ref(fn.seed, 0, 0.1, 1.0)
    # MoE input rows: [router E ; shared gate 1 ; shared gate_proj ; shared up_proj]
    f, e, sh = "L1.moe_input", g.experts, g.shared
    assert p["model.layers.1.mlp.gate.weight"][e - 1, 5].item() == fused(f, e - 1, 5, h)
    assert p["model.layers.1.mlp.shared_expert_gate.weight"][0, 6].item() == fused(f, e, 6, h)
    assert p["model.layers.1.mlp.shared_expert.gate_proj.weight"][2, 1].item() == fused(f, e + 1 + 2, 1, h)
    assert p["model.layers.1.mlp.shared_expert.up_proj.weight"][0, 0].item() == fused(f, e + 1 + sh, 0, h)
    assert p["model.layers.1.mlp.shared_expert.down_proj.weight"][3, 4].item() == fused("L1.shared_down", 3, 4, sh)
    # experts: gate_up [E, 2I, H] (gate rows then up rows), down [E, H, I]
    gu = p["model.layers.2.mlp.experts.gate_up_proj"]
    k, I = 5, g.inter
    assert gu[k, I + 1, 2].item() == fused("L2.gate_up", k * 2 * I + I + 1, 2, h)
    dn = p["model.layers.2.mlp.experts.down_proj"]
    assert dn[k, 3, 7].item() == fused("L2.down", k * h + 3, 7, I)
    # embed, lm_head
    assert p["model.embed_tokens.weight"][100, 3].item() == fused("embed", 100, 3, h)
    assert fills["embed"].scale == hb.EMBED_SCALE
    assert p["lm_head.weight"][511, 63].item() == fused("lm_head", 511, 63, h)


def test_tiny_keep_f32_and_bf16_paths():
    g = hb.tiny()
    m, filled, _ = hb.build_filled(g, "cpu", torch.bfloat16, keep_f32=True)
    p = dict(m.named_parameters())
    assert len(filled) == len(p)
    assert p["model.norm.weight"].dtype == torch.float32
    assert p["model.layers.0.linear_attn.A_log"].dtype == torch.float32
    assert p["model.layers.0.linear_attn.conv1d.weight"].dtype == torch.float32
    assert p["lm_head.weight"].dtype == torch.bfloat16
    m2, _, _ = hb.build_filled(g, "cpu", torch.bfloat16)
    p2 = dict(m2.named_parameters())
    # bf16 model: the f32 values rounded (RNE) once
    assert torch.equal(p2["model.norm.weight"], p["model.norm.weight"].to(torch.bfloat16))
    assert torch.equal(p2["lm_head.weight"], p["lm_head.weight"])


def test_tiny_bench_end_to_end(tmp_path):
    """The whole script on the tiny model: generate() and the manual loop agree."""
    common = ["--tiny", "--dtype", "float32", "--lens", "9,33", "--runs", "1", "--decode", "6", "--skip-self-check"]
    r1 = hb.main(common + ["--out-dir", str(tmp_path / "g")])
    r2 = hb.main(common + ["--out-dir", str(tmp_path / "l"), "--decode-mode", "loop"])
    assert r1["params_filled"] == r1["params_total"]
    for c1, c2 in zip(r1["cases"], r2["cases"]):
        assert c1["greedy"] == c2["greedy"]
        assert len(c1["greedy"]) == 6
        assert c1["logits_finite"]
        if c1["logits_top1_margin"] > 1e-3:
            assert c1["logits_argmax"] == c1["greedy"][0]
        assert (tmp_path / "g" / f"hf_logits_{c1['len']}.f32").stat().st_size == 4 * 512
    assert (tmp_path / "g" / "hf_bench.json").exists()
    # comparison: identical files -> KL 0, top-1 agree, tokens identical
    f = str(tmp_path / "g" / "hf_logits_9.f32")
    cmp = hb.main(["--compare-logits", f, "--len", "9", "--out-dir", str(tmp_path / "g"),
                   "--ours-json", str(tmp_path / "l" / "hf_tokens_9.json")])
    assert abs(cmp["kl_hf_ours"]) < 1e-12 and cmp["top1_agree"]
    assert cmp["tokens"]["common_prefix"] == 6


def test_prompt_formula():
    ids = hb.prompt_ids(512, 248_320)
    assert ids[0] == 1 + (512 * 7919) % 248_319
    assert ids[5] == 1 + (5 * 1_000_003 + 512 * 7919) % 248_319
    assert all(1 <= t < 248_320 for t in hb.prompt_ids(8192, 248_320))
