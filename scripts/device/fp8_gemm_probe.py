#!/usr/bin/env python3
"""FP8 block-scaled prompt GEMMs on the GPU machine (issue 28), before the
engine uses them: for each dense prompt projection of Qwen3.6-35B-A3B at
M tokens, cuBLAS(Lt) through torch._scaled_mm with 1x128 activation scales
and 128x128 weight scales against the bf16 GEMM the split-precision prefill
runs twice, and the result against the dequantized product in f64 (so the
scale layouts the engine passes to cuBLASLt are the ones checked here).
Also whether transformers' FP8Linear (the FP8-activation reference) runs.
Writes JSON to argv[1]."""
import ctypes, json, sys, time
import torch

M = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
SHAPES = {  # name: (N, K, layers)
    "gdn_in_qkvz": (12288, 2048, 30), "gdn_out": (2048, 4096, 30),
    "attn_qkv": (9216, 2048, 10), "attn_o": (2048, 4096, 10),
    "shared_gate_up": (1024, 2048, 40), "shared_down": (2048, 512, 40),
}
dev = torch.device("cuda")
F8 = torch.float8_e4m3fn


def quant_blocks(x, bm, bk):
    """x [R, C] f32 -> e4m3 and f32 scales per (bm x bk) block, amax / 448."""
    r, c = x.shape
    xb = x.view(r // bm, bm, c // bk, bk)
    s = xb.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-12) / 448.0
    q = (xb / s).to(F8).view(r, c)
    return q, s.view(r // bm, c // bk)


def timed(fn, reps=20):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "m": M, "shapes": {}}
try:
    lt = ctypes.CDLL("libcublasLt.so.13")
    lt.cublasLtGetVersion.restype = ctypes.c_size_t
    out["cublaslt_version"] = lt.cublasLtGetVersion()
except OSError as e:
    out["cublaslt_version"] = str(e)
torch.manual_seed(0)
tot_bf16 = tot_fp8 = 0.0
for name, (n, k, layers) in SHAPES.items():
    x = torch.randn(M, k, device=dev)
    w = torch.randn(n, k, device=dev) * 0.02
    wq, ws = quant_blocks(w, 128, 128)             # ws [n/128, k/128] row-major
    xq, xs = quant_blocks(x, 1, 128)               # xs [M, k/128]
    xs_om = xs.t().contiguous().t()                # outer-dim-major, stride (1, M)
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    rec = {"n": n, "k": k, "layers": layers}
    try:
        f = lambda: torch._scaled_mm(xq, wq.t(), xs_om, ws.t(), out_dtype=torch.float32)
        y = f()
        ref = (xq.double() * xs.double().repeat_interleave(128, 1)) @ \
              (wq.double() * ws.double().repeat_interleave(128, 0).repeat_interleave(128, 1)).t()
        rec["max_rel_err_vs_dequantized_f64"] = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        rec["fp8_f32out_ms"] = timed(f)
        rec["fp8_bf16out_ms"] = timed(lambda: torch._scaled_mm(xq, wq.t(), xs_om, ws.t(), out_dtype=torch.bfloat16))
    except Exception as e:  # noqa: BLE001 - report what the library refused
        rec["fp8_error"] = repr(e)[:400]
    rec["bf16_one_term_ms"] = timed(lambda: xb @ wb.t())
    rec["tflops_fp8"] = 2 * M * n * k / rec.get("fp8_f32out_ms", float("nan")) / 1e9
    rec["tflops_bf16"] = 2 * M * n * k / rec["bf16_one_term_ms"] / 1e9
    tot_bf16 += 2 * rec["bf16_one_term_ms"] * layers
    tot_fp8 += rec.get("fp8_f32out_ms", float("nan")) * layers
    out["shapes"][name] = rec
    print(name, json.dumps(rec), flush=True)
out["per_prompt_ms"] = {"bf16_split_two_terms": tot_bf16, "fp8_block_scaled": tot_fp8}
try:
    from transformers.integrations.finegrained_fp8 import FP8Linear
    lin = FP8Linear(2048, 1024, bias=False, block_size=(128, 128)).to(dev)
    w = torch.randn(1024, 2048, device=dev) * 0.02
    wq, ws = quant_blocks(w, 128, 128)
    lin.weight.data.copy_(wq)
    scale = lin.weight_scale_inv if hasattr(lin, "weight_scale_inv") else lin.weight_scale
    scale.data.copy_(ws)
    xx = torch.randn(3, 2048, device=dev, dtype=torch.bfloat16)
    y = lin(xx)
    out["transformers_fp8linear"] = {"ok": True, "dtype": str(y.dtype), "finite": bool(torch.isfinite(y).all())}
except Exception as e:  # noqa: BLE001
    out["transformers_fp8linear"] = {"ok": False, "error": repr(e)[:400]}
print(json.dumps({k: v for k, v in out.items() if k != "shapes"}), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
