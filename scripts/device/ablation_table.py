#!/usr/bin/env python3
"""The decode ablation's table: each stage's in-graph cost against its floor.

    python3 scripts/device/ablation_table.py OUT.json COMMIT DIR [DIR ...]

Each DIR holds one `scripts/device/ablation.sh` run (skip-<stages>.json from
`qwasi bench --workload speed` with QWASI_DEC_SKIP=<stages>, and
skip-none.json, the full step of the same call). A stage's cost is the step
time with it minus the step time without it, against the `none` run of its
own directory (calls on different leases differ by ~1%). Its floor is the
bytes it must move over the copy bandwidth measured in the same run. Bytes
are those of the qwen3.6-35b-a3b geometry (30 GDN + 10 attention layers,
MoE of 256 experts, 8 routed + a shared one) at the context of the runs,
f32 KV; see docs/PERFORMANCE.md "Where the decode time goes".
"""
import glob
import json
import os
import sys

H, B, F = 2048, 2, 4
GDN, ATT, LAYERS = 30, 10, 40
IN_ROWS = 2 * 16 * 128 + 32 * 128 + 32 * 128 + 2 * 32  # q, k, v, z, b, a
STATE = 32 * 128 * 128 * F
ATT_ROWS = 16 * 256 * 2 + 2 * 2 * 256  # q + gate, k, v
KV_ROW = 2 * 2 * 256 * F  # K and V of 2 kv heads
VOCAB = 248320
E_ROWS = 256 + 1 + 2 * 512  # router, shared gate, shared gate/up
K, I = 8, 512


def stage_bytes(ctx: int) -> dict:
    return {
        "in_proj": GDN * IN_ROWS * H * B,
        "gdn_step": GDN * 2 * STATE,
        "out_proj": GDN * H * 4096 * B,
        "attn_proj": ATT * ATT_ROWS * H * B,
        "attn_prep,attn,attn_combine": ATT * KV_ROW * ctx,
        "o_proj": ATT * H * 4096 * B,
        "moe_input": LAYERS * E_ROWS * H * B,
        "moe_gate_up": LAYERS * K * 2 * I * H * B,
        "moe_down": LAYERS * (K + 1) * I * H * B,
        "lm_head": VOCAB * H * B,
    }


def main() -> int:
    out, commit, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    rows, runs = [], {}
    full = None
    for d in dirs:
        def rate(name):
            r = json.load(open(os.path.join(d, f"skip-{name}.json")))
            return r, r["results"][0]["decode_tok_per_s"]
        base, brate = rate("none")
        step_ms = 1e3 / brate["median"]
        full = full or {"ms": step_ms, "tok_per_s": brate["median"]}
        bw = base["copy_bandwidth_bytes_per_s"]
        ctx = base["results"][0]["prompt_len"] + base["results"][0]["decode_tokens"] // 2
        nbytes = stage_bytes(ctx)
        runs[f"{os.path.basename(d)}/none"] = brate
        for f in sorted(glob.glob(os.path.join(d, "skip-*.json"))):
            name = os.path.basename(f)[5:-5]
            if name == "none":
                continue
            _, r = rate(name)
            runs[f"{os.path.basename(d)}/{name}"] = r
            cost = step_ms - 1e3 / r["median"]
            b = nbytes.get(name)
            rows.append({
                "stage": name,
                "ms_per_token": round(cost, 4),
                "bytes": b,
                "floor_ms": round(b / bw * 1e3, 4) if b else None,
                "full_step_ms_same_call": round(step_ms, 4),
            })
    rows.sort(key=lambda r: -r["ms_per_token"])
    report = {
        "what": "In-graph cost of each stage of the decode step: bench --workload speed with the full step and "
                "once per stage left out (QWASI_DEC_SKIP, measurement only: wrong tokens); cost = step time with it "
                "minus step time without it, against the full step of the same device call. Floor = the stage's "
                "bytes over the copy bandwidth measured in the same run.",
        "commit": commit,
        "full_step": full,
        "stages": rows,
        "runs": runs,
    }
    json.dump(report, open(out, "w"), indent=1)
    print(f"{'stage':<32} {'ms/token':>9} {'floor ms':>9}")
    for r in rows:
        print(f"{r['stage']:<32} {r['ms_per_token']:9.3f} {r['floor_ms'] if r['floor_ms'] is not None else float('nan'):9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
