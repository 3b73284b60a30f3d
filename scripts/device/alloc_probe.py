"""What a prefix-cache restore of a 131K-token snapshot costs besides its
kernels, on the GPU machine: cuMemAlloc / cuMemFree (what Device::alloc and
DBuf's drop call) of the restore's buffers, and its device-to-device copies.

    python3 scripts/device/alloc_probe.py [--rows 131072] [--cap 147456]

Prints one JSON object. The sizes are the 35B model's: 10 attention layers x
K and V of cap rows of 2 KV heads x 256 f32 (2 KiB a row; 1 KiB with a bf16
cache), 30 GDN layers x (conv state, recurrent state).
"""
import argparse, ctypes, json, time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, default=131072)
ap.add_argument("--cap", type=int, default=147456)
ap.add_argument("--row-bytes", type=int, default=2048)
a = ap.parse_args()

torch.zeros(1, device="cuda")  # the primary context, current on this thread
cu = ctypes.CDLL("libcuda.so.1")


def ok(r, what):
    if r != 0:
        raise SystemExit(f"{what}: CUresult {r}")


def alloc(n):
    p = ctypes.c_uint64()
    ok(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc")
    return p.value


def sync():
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")


def timed(f):
    sync()
    t = time.perf_counter()
    r = f()
    sync()
    return r, (time.perf_counter() - t) * 1e3


kv = a.cap * a.row_bytes
gdn = [3 * 8192 * 4, 32 * 128 * 128 * 4]  # conv state (kernel - 1 taps), recurrent state
out = {"kv_buffer_bytes": kv, "copy_bytes_per_buffer": a.rows * a.row_bytes}
src, _ = timed(lambda: [alloc(kv) for _ in range(20)])
for rep in range(3):
    bufs, t_kv = timed(lambda: [alloc(kv) for _ in range(20)])
    g, t_gdn = timed(lambda: [alloc(n) for _ in range(30) for n in gdn])
    _, t_copy = timed(lambda: [cu.cuMemcpyDtoD_v2(ctypes.c_uint64(d), ctypes.c_uint64(s), ctypes.c_size_t(a.rows * a.row_bytes)) for d, s in zip(bufs, src)])
    _, t_free = timed(lambda: [cu.cuMemFree_v2(ctypes.c_uint64(p)) for p in bufs + g])
    out[f"run{rep}"] = {"alloc_20_kv_ms": t_kv, "alloc_60_gdn_ms": t_gdn, "copy_20_kv_ms": t_copy, "free_all_ms": t_free}
print(json.dumps(out, indent=1))
