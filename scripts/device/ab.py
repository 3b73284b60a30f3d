#!/usr/bin/env python3
"""A/B runs on the GPU machine: verify every variant, then alternate their benchmarks.

    python3 scripts/device/ab.py PRESET [--a BIN] [--b BIN] [--env 'K=V ...'] [--rounds N] ...
    python3 scripts/device/ab.py --list

A variant is a binary (A: the base build, B: the build under test) with
environment settings. Every variant first passes the preset's checks with
its own settings (`qwasi verify` over the reference fixtures, `verify
--synthetic` on the full geometry, compute-sanitizer where asked); then each
benchmark phase runs `qwasi bench --workload speed` for every variant,
alternating for the preset's rounds (A B, then B A, ...: drift of the lease
spreads over both), with the fixtures skipped there (the checks ran them on
the same binary). Phases that compare numerics dump the last logits in
their first round and compare every variant with the first
(scripts/device/logits_compare.py).

Output: $OUT/ab-PRESET.json (rewritten after every step, so a call cut
short still returns what ran): the preset, the command line, the GPU, each
variant's binary (sha256) and commit, every check with its verify JSON,
every bench report, and a summary per phase and prompt length (medians of
the runs' medians, each variant against the first). Logs go to
$OUT/ab-PRESET-logs.tgz. The device returns at most 8 files: these are 2.

Runs are skipped, whole rounds at a time, once the next one would end past
--budget-s (default 540 s, inside the device tool's 10-minute command).

The release preset is issue 22's check of a restructured build against the
tree it started from (43b3567), both built with --features cuda:

    python3 scripts/device/ab.py release --a .dev/qbase --b .dev/qwasi

--list prints every preset with what it runs.
"""
import argparse
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field

SYNTHETIC = "qwen3.6-35b-a3b"
LOGITS_COMPARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "logits_compare.py")


@dataclass
class Variant:
    name: str
    role: str  # "a" (base build) or "b" (build under test)
    env: dict = field(default_factory=dict)


@dataclass
class Check:
    kind: str  # fixtures | synthetic | memcheck
    args: list = field(default_factory=list)  # verify flags in pairs (synthetic: they replace the defaults)
    only: list = None  # variant names; None: every variant


@dataclass
class Phase:
    name: str
    args: list  # qwasi bench --workload speed flags
    rounds: int = 1
    logits: bool = False  # dump logits in round 1 and compare every variant with the first
    env: dict = field(default_factory=dict)  # added to every variant's settings in this phase
    only: list = None
    optional: str = None  # runs only when this command-line flag is set


@dataclass
class Preset:
    doc: str
    variants: object  # callable(args) -> [Variant]
    checks: list
    phases: list
    tolerance: float = None  # B/A within 1 ± tolerance: reported per metric


def env_of(spec):
    """'K=V K2=V2' -> dict."""
    out = {}
    for kv in shlex.split(spec):
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise SystemExit(f"ab.py: {spec!r}: settings are K=V separated by spaces")
        out[k] = v
    return out


def with_base(a, rest):
    """The base build first when --a is given, then the variants of the build under test."""
    return ([Variant("base", "a")] if a.a else []) + rest


def env_variants(a):
    extra = [Variant(" ".join(f"{k}={v}" for k, v in env_of(s).items()), "b", env_of(s)) for s in a.env]
    if not extra:
        raise SystemExit("ab.py env: give at least one --env 'QWASI_X=Y' to compare with the default")
    return [Variant("default", "b")] + extra


SPEED = ["--lens", "512,8192", "--decode-tokens", "128", "--runs", "5", "--warmups", "2"]

PRESETS = {
    "release": Preset(
        "Issue 22: binary A (the base tree, e.g. 43b3567) against binary B (the restructured build), "
        "no settings. Both pass `verify` (9 fixtures) and `verify --synthetic` (40 layers); then "
        "512 and 8K decode tok/s and TTFT, 5 timed runs after 2 warm-ups per bench run, A and B "
        "alternating for 4 rounds; the round-1 logits of B compared with A's; B/A within ±1% "
        "reported per metric.",
        lambda a: [Variant("A", "a"), Variant("B", "b")],
        [Check("fixtures"), Check("synthetic")],
        [Phase("speed", SPEED, rounds=4, logits=True)],
        tolerance=0.01,
    ),
    "fp8": Preset(
        "Issue 28's FP8 decode kernels: binary A (the base build) against binary B on the synthetic "
        "FP8 model (qwen3.6-35b-a3b-fp8, weights kept FP8). Both pass `verify` (the fixtures; the FP8 "
        "fixture kept against dequantized at upload, through decode and batched steps) and `verify "
        "--synthetic qwen3.6-35b-a3b-fp8` (40 layers); then 512 and 8K decode tok/s and TTFT, A and B "
        "alternating for 3 rounds, the round-1 logits of B compared with A's.",
        lambda a: [Variant("A", "a"), Variant("B", "b")],
        [Check("fixtures"), Check("synthetic", ["--synthetic", "qwen3.6-35b-a3b-fp8"])],
        [Phase("speed", ["--synthetic", "qwen3.6-35b-a3b-fp8", *SPEED], rounds=3, logits=True)],
    ),
    "env": Preset(
        "One binary (B) under environment settings (--env, repeatable) against its defaults, "
        "e.g. --env QWASI_MOE_BK64=32: fixtures per setting, then 512/8K speed alternating for "
        "2 rounds (was env_ab.sh).",
        env_variants,
        [Check("fixtures")],
        [Phase("speed", SPEED, rounds=2)],
    ),
    "gdn-conv": Preset(
        "The GDN decode conv folded into the in projection (default) against its own kernel "
        "(QWASI_GDN_CONV=kernel), and against a base build when --a is given: verify + verify "
        "--synthetic each, then 512/8K speed alternating for 2 rounds (was gdn_conv_ab.sh).",
        lambda a: with_base(a, [Variant("kernel", "b", {"QWASI_GDN_CONV": "kernel"}), Variant("fold", "b")]),
        [Check("fixtures"), Check("synthetic")],
        [Phase("speed", SPEED, rounds=2)],
    ),
    "prefill": Preset(
        "The prompt path of B against a base build A (optional): verify + verify --synthetic, "
        "per-kernel prompt times at 8K (QWASI_GPU_PROFILE=1), TTFT at 512/8K/32K (2 + 5 runs, "
        "32 decoded tokens) with the logits compared, and with --long the 131K TTFT of B "
        "(was prefill_ab.sh).",
        lambda a: [Variant("new", "b")] + ([Variant("old", "a")] if a.a else []),
        [Check("fixtures"), Check("synthetic")],
        [
            Phase("profile", ["--lens", "8192", "--decode-tokens", "16", "--runs", "1", "--warmups", "0"],
                  env={"QWASI_GPU_PROFILE": "1"}),
            Phase("speed", ["--lens", "512,8192,32768", "--decode-tokens", "32", "--runs", "5",
                            "--warmups", "2", "--ttft-max", "32768"], logits=True),
            Phase("long", ["--lens", "131072", "--ttft-max", "131072", "--decode-tokens", "8",
                           "--runs", "3", "--warmups", "1"], only=["new"], optional="long"),
        ],
    ),
    "dec-attn-keys": Preset(
        "The key-parallel decode attention (QWASI_DEC_ATTN=keys|keys1) against the default "
        "kernels of one binary: fixtures with each kernel forced, 512/8K decode (2 + 5 runs), "
        "then 32K/131K (one run of 32 tokens), logits against the default's (was dec_attn_keys.sh).",
        lambda a: [Variant("default", "b"), Variant("keys", "b", {"QWASI_DEC_ATTN": "keys"}),
                   Variant("keys1", "b", {"QWASI_DEC_ATTN": "keys1"})],
        [Check("fixtures")],
        [
            Phase("speed", SPEED, logits=True),
            Phase("long", ["--lens", "32768,131072", "--decode-tokens", "32", "--runs", "1", "--warmups", "0"],
                  logits=True),
        ],
    ),
    "dec-attn-tc": Preset(
        "The feeds of the tensor-core decode attention, one binary, each forced with "
        "QWASI_DEC_ATTN (tc: registers; tc-ring2..4: a cp.async ring of 2-4 slots): fixtures "
        "with each, decode at 8K/32K/131K (one run of 64 tokens after a warm-up), logits "
        "against tc's (was dec_attn_tc.sh).",
        lambda a: [Variant(p, "b", {"QWASI_DEC_ATTN": p}) for p in ("tc", "tc-ring2", "tc-ring3", "tc-ring4")],
        [Check("fixtures")],
        [Phase("decode", ["--lens", "8192,32768,131072", "--decode-tokens", "64", "--runs", "1",
                          "--warmups", "1"], logits=True)],
    ),
    "gemv-bulk": Preset(
        "The bulk-copy decode GEMVs (default) against the split-row ones (QWASI_GEMV=rows) and "
        "other ring shapes (QWASI_BULK_STAGES, QWASI_BULK_BLOCKS): verify --synthetic at 8 layers "
        "and compute-sanitizer memcheck of one fixture on the default, fixtures on every shape, "
        "512/8K decode (1 + 3 runs), then `bench --probe` of default and rows (was gemv_bulk.sh).",
        lambda a: [Variant("bulk", "b"), Variant("rows", "b", {"QWASI_GEMV": "rows"}),
                   Variant("stages2", "b", {"QWASI_BULK_STAGES": "2"}),
                   Variant("stages4", "b", {"QWASI_BULK_STAGES": "4"}),
                   Variant("stages2x2", "b", {"QWASI_BULK_STAGES": "2", "QWASI_BULK_BLOCKS": "2"})],
        [Check("fixtures"),
         Check("synthetic", ["--layers", "8", "--prompt-len", "1000", "--gen-tokens", "32"], only=["bulk"]),
         Check("memcheck", only=["bulk"])],
        [
            Phase("speed", ["--lens", "512,8192", "--decode-tokens", "128", "--runs", "3", "--warmups", "1"]),
            Phase("probe", ["--lens", "512", "--decode-tokens", "8", "--runs", "1", "--warmups", "0", "--probe"],
                  only=["bulk", "rows"]),
        ],
    ),
}


class Runner:
    def __init__(self, a, preset):
        self.a, self.preset = a, preset
        self.t0 = time.monotonic()
        self.work = os.path.join(a.work, a.preset)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        os.makedirs(a.out, exist_ok=True)
        self.out = os.path.join(a.out, f"ab-{a.preset}.json")
        self.bins = {"a": a.a, "b": a.b}
        self.variants = preset.variants(a)
        for v in self.variants:
            b = self.bins[v.role]
            if not b:
                raise SystemExit(f"ab.py {a.preset}: variant {v.name} needs --{v.role} BIN")
            if os.path.isfile(b) and not os.access(b, os.X_OK):
                os.chmod(b, os.stat(b).st_mode | 0o111)  # a carried binary may lose its mode bits
            if not os.access(b, os.X_OK):
                raise SystemExit(f"ab.py {a.preset}: {b} is not an executable file")
        self.report = {
            "what": preset.doc,
            "preset": a.preset,
            "command": " ".join(shlex.quote(x) for x in [sys.executable, *sys.argv]),
            "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("QWASI_")},
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "scripts_commit": git_commit(),
            "gpu": gpu_info(),
            "budget_s": a.budget_s,
            "order": "each round runs the variants in turn, the order reversed every other round",
            "variants": [{"name": v.name, "role": v.role.upper(), "binary": self.bins[v.role],
                          "binary_sha256": sha256(self.bins[v.role]), "env": v.env, "commit": None}
                         for v in self.variants],
            "checks": [],
            "phases": {},
            "skipped": [],
            "pass": None,
        }
        self.save()

    def elapsed(self):
        return time.monotonic() - self.t0

    def save(self):
        self.report["wall_s"] = round(self.elapsed(), 1)
        tmp = self.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.report, f, indent=1)
        os.replace(tmp, self.out)

    def run(self, name, argv, env, timeout):
        """Runs argv with env added; the log in the work dir. Returns (rc, seconds, log tail)."""
        log = os.path.join(self.work, name + ".log")
        t = time.monotonic()
        with open(log, "w") as f:
            f.write("$ " + " ".join(f"{k}={v}" for k, v in env.items()) + " "
                    + " ".join(shlex.quote(x) for x in argv) + "\n")
            f.flush()
            try:
                rc = subprocess.run(argv, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                                    timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = 124
                f.write(f"\nab.py: killed after {timeout} s\n")
        with open(log, errors="replace") as f:
            tail = f.read()[-1500:]
        return rc, round(time.monotonic() - t, 1), tail

    def checks(self):
        for c in self.preset.checks:
            for v in self.variants:
                if c.only is not None and v.name not in c.only:
                    continue
                if self.elapsed() > self.a.budget_s:
                    self.report["skipped"].append(f"check {c.kind} {v.name}: over the budget")
                    continue
                self.check(c, v)
                self.save()

    def check(self, c, v):
        b = self.bins[v.role]
        name = f"check-{c.kind}-{slug(v.name)}"
        js = os.path.join(self.work, name + ".json")
        if c.kind == "fixtures":
            argv = [b, "verify", "--backend", "cuda", "--json", js, *c.args]
        elif c.kind == "synthetic":
            flags = {"--synthetic": SYNTHETIC, "--prompt-len": "300", "--gen-tokens": "16",
                     **dict(zip(c.args[::2], c.args[1::2]))}
            argv = [b, "verify", "--backend", "cuda", "--no-fixtures", "--json", js,
                    *(x for kv in flags.items() for x in kv)]
        elif c.kind == "memcheck":
            if not shutil.which("compute-sanitizer"):
                self.report["checks"].append({"variant": v.name, "check": c.kind, "pass": None,
                                              "skipped": "compute-sanitizer not found"})
                return
            argv = ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "10", b, "verify",
                    "--backend", "cuda", "--model", "tests/fixtures/models/moe-flat", *c.args]
        else:
            raise SystemExit(f"ab.py: unknown check {c.kind}")
        rc, secs, tail = self.run(name, argv, v.env, self.a.timeout)
        entry = {"variant": v.name, "check": c.kind, "command": cmdline(v.env, argv), "rc": rc,
                 "seconds": secs, "pass": rc == 0, "verify": load_json(js)}
        if rc != 0:
            entry["log_tail"] = tail
        print(f"[ab] check {c.kind:<9} {v.name:<12} {'PASS' if rc == 0 else f'FAIL (exit {rc})'} {secs:6.1f} s",
              flush=True)
        self.report["checks"].append(entry)

    def phases(self):
        for p in self.preset.phases:
            if p.optional and not getattr(self.a, p.optional):
                continue
            vs = [v for v in self.variants if p.only is None or v.name in p.only]
            rounds = self.a.rounds or p.rounds
            rec = self.report["phases"][p.name] = {"bench_args": self.bench_args(p), "rounds": rounds,
                                                  "runs": [], "summary": None}
            longest = 0.0
            for r in range(1, rounds + 1):
                if self.elapsed() + longest * len(vs) > self.a.budget_s:
                    self.report["skipped"].append(f"{p.name}: rounds {r}-{rounds}, over the budget")
                    break
                for v in (vs if r % 2 else vs[::-1]):
                    run = self.bench(p, v, r)
                    longest = max(longest, run["seconds"])
                    rec["runs"].append(run)
                    rec["summary"] = summarize(rec["runs"], [v.name for v in vs], self.preset.tolerance)
                    self.save()
            if p.logits:
                rec["logits"] = self.compare_logits(p, vs)
            rec["summary"] = summarize(rec["runs"], [v.name for v in vs], self.preset.tolerance)
            self.save()

    def bench_args(self, p):
        args = list(p.args)
        if self.a.lens and "--lens" in args:
            args[args.index("--lens") + 1] = self.a.lens
        if self.a.runs and "--runs" in args:
            args[args.index("--runs") + 1] = str(self.a.runs)
        return args

    def bench(self, p, v, r):
        b = self.bins[v.role]
        name = f"{p.name}-{r}-{slug(v.name)}"
        js = os.path.join(self.work, name + ".json")
        argv = [b, "bench", "--workload", "speed", "--backend", "cuda", *self.bench_args(p),
                "--fixtures", "/nonexistent", "--out", js]
        if p.logits and r == 1:
            argv += ["--dump-logits", os.path.join(self.work, f"logits-{p.name}-{slug(v.name)}")]
        env = {**v.env, **p.env}
        rc, secs, tail = self.run(name, argv, env, self.a.timeout)
        rep = load_json(js)
        for line in tail.splitlines():
            if line.startswith("[bench] L"):
                print(f"[ab] {p.name} round {r} {v.name:<12} {line[8:120]}", flush=True)
        if rc != 0:
            print(f"[ab] {p.name} round {r} {v.name}: exit {rc}\n{tail[-600:]}", flush=True)
        if isinstance(rep, dict):
            for var in self.report["variants"]:
                if var["name"] == v.name and rep.get("commit"):
                    var["commit"] = rep["commit"]
        run = {"round": r, "variant": v.name, "command": cmdline(env, argv), "rc": rc, "seconds": secs,
               "report": rep}
        if rc != 0:
            run["log_tail"] = tail
        return run

    def compare_logits(self, p, vs):
        out = {}
        first = os.path.join(self.work, f"logits-{p.name}-{slug(vs[0].name)}")
        for v in vs[1:]:
            other = os.path.join(self.work, f"logits-{p.name}-{slug(v.name)}")
            if not (os.path.isdir(first) and os.path.isdir(other)):
                out[v.name] = "missing: a round-1 run did not dump its logits"
                continue
            res = subprocess.run([sys.executable, LOGITS_COMPARE, first, other], capture_output=True, text=True)
            try:
                out[v.name] = json.loads(res.stdout)
            except ValueError:
                out[v.name] = {"error": res.stderr[-800:]}
            files = out[v.name].get("files", {}) if isinstance(out[v.name], dict) else {}
            print(f"[ab] logits {p.name}: {v.name} vs {vs[0].name}: "
                  + ", ".join(f"{k}: " + ("bit-identical" if isinstance(x, dict) and x.get("bit_identical")
                                          else (f"KL {x['kl']:.2e}" if isinstance(x, dict) else str(x)))
                              for k, x in files.items()), flush=True)
        return out

    def finish(self):
        ok = all(c["pass"] is not False for c in self.report["checks"])
        ok &= not any(s.startswith("check") for s in self.report["skipped"])  # unchecked builds prove nothing
        for ph in self.report["phases"].values():
            ok &= all(r["rc"] == 0 and isinstance(r["report"], dict) and r["report"].get("greedy_consistent", True)
                      for r in ph["runs"])
            ok &= all(isinstance(c, dict) and c.get("pass") for c in ph.get("logits", {}).values())
        self.report["pass"] = ok
        self.save()
        with tarfile.open(os.path.join(self.a.out, f"ab-{self.a.preset}-logs.tgz"), "w:gz") as t:
            for f in sorted(os.listdir(self.work)):
                if f.endswith((".log", ".json")):
                    t.add(os.path.join(self.work, f), arcname=f)
        print_summary(self.report)
        print(f"[ab] {'PASS' if ok else 'FAIL'}: {self.out} ({self.elapsed():.0f} s)", flush=True)
        return 0 if ok else 1


def summarize(runs, names, tolerance):
    """Per prompt length and variant: the medians of the runs' medians (decode tok/s, TTFT ms),
    and each variant against the first."""
    per = {}
    for run in runs:
        rep = run["report"]
        if run["rc"] != 0 or not isinstance(rep, dict):
            continue
        for res in rep.get("results", []):
            d = per.setdefault(str(res["prompt_len"]), {}).setdefault(run["variant"], {"decode": [], "ttft": []})
            d["decode"].append(res["decode_tok_per_s"]["median"])
            if "ttft_ms" in res:
                d["ttft"].append(res["ttft_ms"]["median"])
            if res.get("prefill_profile_ms"):
                top = sorted(res["prefill_profile_ms"], key=lambda k: -k["ms"])[:12]
                d["prefill_kernels_ms"] = {k["kernel"]: round(k["ms"], 2) for k in top}
        if rep.get("probe"):
            per.setdefault("probe", {})[run["variant"]] = rep["probe"]
    out = {}
    for length, byv in per.items():
        if length == "probe":
            out[length] = byv
            continue
        row = {}
        for n in names:
            if n not in byv:
                continue
            d = byv[n]
            row[n] = {"decode_tok_per_s": med(d["decode"]), "ttft_ms": med(d["ttft"]),
                      "decode_runs": d["decode"], "ttft_runs": d["ttft"]}
            if "prefill_kernels_ms" in d:
                row[n]["prefill_kernels_ms"] = d["prefill_kernels_ms"]
        ref = row.get(names[0])
        for n in names[1:]:
            if ref is None or n not in row:
                continue
            vs = {}
            for m in ("decode_tok_per_s", "ttft_ms"):
                if ref[m] and row[n][m]:
                    ratio = row[n][m] / ref[m]
                    vs[m] = {"ratio": round(ratio, 5), "change_pct": round((ratio - 1) * 100, 2)}
                    if tolerance is not None:
                        vs[m]["within_tolerance"] = abs(ratio - 1) <= tolerance
            row[n][f"vs_{names[0]}"] = vs
        out[length] = row
    if tolerance is not None:
        out["tolerance"] = tolerance
    return out


def print_summary(report):
    for pname, ph in report["phases"].items():
        for length, row in (ph.get("summary") or {}).items():
            if not isinstance(row, dict) or length == "probe":
                continue
            for n, d in row.items():
                vs = next((x for k, x in d.items() if k.startswith("vs_")), {})
                extra = "  ".join(f"{m.split('_')[0]} {x['change_pct']:+.2f}%"
                                  + ("" if x.get("within_tolerance", True) else " OUT")
                                  for m, x in vs.items())
                dec = d["decode_tok_per_s"]
                ttft = d["ttft_ms"]
                print(f"[ab] {pname:<8} L {length:>6} {n:<12} decode {fmt(dec, 7, 1)} tok/s  "
                      f"TTFT {fmt(ttft, 9, 2)} ms  {extra}", flush=True)


def fmt(x, width, digits):
    return f"{x:{width}.{digits}f}" if x is not None else " " * (width - 1) + "-"


def med(xs):
    return statistics.median(xs) if xs else None


def slug(s):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


def cmdline(env, argv):
    return " ".join([*(f"{k}={v}" for k, v in env.items()), *(shlex.quote(x) for x in argv)])


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return f"no report: {e}"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_info():
    q = "name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return [dict(zip(q.split(","), (x.strip() for x in line.split(",")))) for line in out.splitlines()] or None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset", nargs="?", choices=sorted(PRESETS))
    ap.add_argument("--list", action="store_true", help="print the presets and exit")
    ap.add_argument("--a", default=os.environ.get("QWASI_BIN_BASE"), help="binary A, the base build ($QWASI_BIN_BASE)")
    ap.add_argument("--b", "--bin", default=os.environ.get("QWASI_BIN", "target/release/qwasi"),
                    help="binary B, the build under test ($QWASI_BIN, default target/release/qwasi)")
    ap.add_argument("--env", action="append", default=[], help="env preset: settings 'K=V ...' to compare")
    ap.add_argument("--rounds", type=int, help="rounds of every phase (default: the preset's)")
    ap.add_argument("--lens", help="prompt lengths of every phase (default: the preset's)")
    ap.add_argument("--runs", type=int, help="timed runs per bench run (default: the preset's)")
    ap.add_argument("--long", action="store_true", help="prefill preset: also the 131K TTFT")
    ap.add_argument("--budget-s", type=float, default=540, help="start no round that would end past this")
    ap.add_argument("--timeout", type=int, default=300, help="seconds one verify or bench may take")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/qwasi-out"), help="report directory ($OUT)")
    ap.add_argument("--work", default="/tmp/qwasi-ab", help="logs, reports and logits of each run")
    a = ap.parse_args(argv)
    if a.list or not a.preset:
        for n, p in PRESETS.items():
            print(f"{n}\n    {p.doc}\n")
        return 0 if a.list else 2
    runner = Runner(a, PRESETS[a.preset])
    runner.checks()
    runner.phases()
    return runner.finish()


if __name__ == "__main__":
    sys.exit(main())
