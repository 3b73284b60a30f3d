"""scripts/device/ab.py without a GPU: the driver runs against a stand-in `qwasi`
(a script that answers `verify` and `bench --workload speed` as the real binary
writes their JSON), so what is checked is the driver's own work: checks before
benchmarks, the alternating order, the budget, the logits comparison, the summary
and the report. Standard library only (CI runs it).

Run: python3 -m unittest discover -s tests/python -p 'test_ab.py'
"""
import contextlib
import importlib.util
import io
import json
import os
import stat
import sys
import tarfile
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("ab", os.path.join(ROOT, "scripts/device/ab.py"))
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)

# A stand-in binary: its speed is FAKE_DECODE tok/s (times 0.9 when QWASI_SLOW=1),
# its commit FAKE_COMMIT; FAKE_VERIFY_FAIL=1 makes `verify` fail; FAKE_LOGIT shifts
# the dumped logits; every call is appended to FAKE_CALLS.
FAKE = r'''#!PYTHON
import json, os, struct, sys, time
argv = sys.argv[1:]
def opt(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps({"bin": os.path.basename(sys.argv[0]), "argv": argv,
                        "slow": os.environ.get("QWASI_SLOW")}) + "\n")
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
if argv[0] == "verify":
    ok = os.environ.get("FAKE_VERIFY_FAIL") != "1"
    if opt("--json"):
        json.dump({"pass": ok, "cases": []}, open(opt("--json"), "w"))
    print("verify:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)
dec = float(os.environ["FAKE_DECODE"]) * (0.9 if os.environ.get("QWASI_SLOW") == "1" else 1.0)
results = []
for n, length in enumerate(opt("--lens").split(",")):
    results.append({"prompt_len": int(length),
                    "decode_tok_per_s": {"median": dec - n, "runs": [dec - n]},
                    "ttft_ms": {"median": 40.0 * (n + 1), "runs": [40.0 * (n + 1)]}})
    print(f"[bench] L {int(length):>6}: TTFT {40.0 * (n + 1):9.1f} ms, decode {dec - n:7.1f} tok/s")
    if opt("--dump-logits"):
        os.makedirs(opt("--dump-logits"), exist_ok=True)
        shift = float(os.environ.get("FAKE_LOGIT", "0"))
        with open(os.path.join(opt("--dump-logits"), f"qwasi_logits_{length}.f32"), "wb") as f:
            f.write(struct.pack("<4f", 1.0, 2.0 + shift, 0.5, -1.0))
json.dump({"commit": os.environ["FAKE_COMMIT"], "greedy_consistent": True, "results": results},
          open(opt("--out"), "w"))
'''


class AbTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.calls = os.path.join(self.dir, "calls.jsonl")
        self.env = dict(os.environ)
        os.environ["FAKE_CALLS"] = self.calls

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.env)
        self.tmp.cleanup()

    def fake(self, name, **env):
        """A stand-in qwasi at DIR/name whose settings are baked in (env applies to it alone)."""
        path = os.path.join(self.dir, name)
        body = FAKE.replace("PYTHON", sys.executable)
        sets = "".join(f"os.environ.setdefault({k!r}, {str(v)!r})\n" for k, v in env.items())
        body = body.replace("argv = sys.argv[1:]\n", "argv = sys.argv[1:]\n" + sets, 1)
        with open(path, "w") as f:
            f.write(body)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return path

    def main(self, *args):
        out = os.path.join(self.dir, "out")
        with contextlib.redirect_stdout(io.StringIO()):
            rc = ab.main([*args, "--out", out, "--work", os.path.join(self.dir, "work")])
        preset = args[0]
        with open(os.path.join(out, f"ab-{preset}.json")) as f:
            return rc, json.load(f), out

    def calls_made(self):
        with open(self.calls) as f:
            return [json.loads(line) for line in f]

    def test_release_checks_both_then_alternates_and_compares(self):
        a = self.fake("qbase", FAKE_DECODE=300, FAKE_COMMIT="43b3567")
        b = self.fake("qwasi", FAKE_DECODE=301.5, FAKE_COMMIT="abc1234")
        rc, rep, out = self.main("release", "--a", a, "--b", b)
        self.assertEqual(rc, 0)
        self.assertTrue(rep["pass"])
        self.assertEqual([v["commit"] for v in rep["variants"]], ["43b3567", "abc1234"])
        # Every check on both binaries before any benchmark.
        calls = self.calls_made()
        kinds = [(c["bin"], c["argv"][0], "--synthetic" in c["argv"]) for c in calls]
        self.assertEqual(kinds[:4], [("qbase", "verify", False), ("qwasi", "verify", False),
                                     ("qbase", "verify", True), ("qwasi", "verify", True)])
        self.assertTrue(all(k[1] == "bench" for k in kinds[4:]))
        # A B, B A, A B, B A; the fixtures skipped in the benchmarks (verify ran them).
        order = [c["bin"] for c in calls[4:]]
        self.assertEqual(order, ["qbase", "qwasi", "qwasi", "qbase", "qbase", "qwasi", "qwasi", "qbase"])
        for c in calls[4:]:
            self.assertIn("/nonexistent", c["argv"])
            self.assertEqual(c["argv"][c["argv"].index("--lens") + 1], "512,8192")
        self.assertEqual(sum("--dump-logits" in c["argv"] for c in calls), 2)
        s = rep["phases"]["speed"]["summary"]
        self.assertEqual(s["512"]["A"]["decode_tok_per_s"], 300.0)
        self.assertEqual(s["512"]["B"]["decode_runs"], [301.5] * 4)
        vs = s["512"]["B"]["vs_A"]["decode_tok_per_s"]
        self.assertAlmostEqual(vs["change_pct"], 0.5)
        self.assertTrue(vs["within_tolerance"])
        self.assertEqual(s["8192"]["B"]["vs_A"]["ttft_ms"]["change_pct"], 0.0)
        logits = rep["phases"]["speed"]["logits"]["B"]
        self.assertTrue(logits["pass"])
        self.assertTrue(all(f["bit_identical"] for f in logits["files"].values()))
        self.assertEqual(len(rep["checks"]), 4)
        with tarfile.open(os.path.join(out, "ab-release-logs.tgz")) as t:
            self.assertIn("check-synthetic-B.log", t.getnames())

    def test_a_change_beyond_the_tolerance_and_in_the_logits_is_reported(self):
        a = self.fake("qbase", FAKE_DECODE=300, FAKE_COMMIT="a")
        b = self.fake("qwasi", FAKE_DECODE=306, FAKE_COMMIT="b", FAKE_LOGIT=0.5)
        rc, rep, _ = self.main("release", "--a", a, "--b", b, "--rounds", "1")
        vs = rep["phases"]["speed"]["summary"]["512"]["B"]["vs_A"]["decode_tok_per_s"]
        self.assertFalse(vs["within_tolerance"])
        files = rep["phases"]["speed"]["logits"]["B"]["files"]
        self.assertFalse(any(f["bit_identical"] for f in files.values()))
        # Different logits beyond logits_compare.py's KL bound fail the run; speed alone does not.
        self.assertEqual(rc, 1)
        self.assertFalse(rep["pass"])

    def test_a_failing_verify_fails_the_run(self):
        a = self.fake("qbase", FAKE_DECODE=300, FAKE_COMMIT="a")
        b = self.fake("qwasi", FAKE_DECODE=300, FAKE_COMMIT="b", FAKE_VERIFY_FAIL=1)
        rc, rep, _ = self.main("release", "--a", a, "--b", b, "--rounds", "1")
        self.assertEqual(rc, 1)
        self.assertFalse(rep["pass"])
        self.assertEqual([c["pass"] for c in rep["checks"]], [True, False, True, False])

    def test_rounds_that_would_pass_the_budget_are_skipped(self):
        a = self.fake("qbase", FAKE_DECODE=300, FAKE_COMMIT="a", FAKE_SLEEP=0.4)
        b = self.fake("qwasi", FAKE_DECODE=300, FAKE_COMMIT="b", FAKE_SLEEP=0.4)
        rc, rep, _ = self.main("release", "--a", a, "--b", b, "--budget-s", "3")
        runs = rep["phases"]["speed"]["runs"]
        self.assertLess(len(runs), 8)
        self.assertEqual(len(runs) % 2, 0)
        self.assertTrue(any("over the budget" in s for s in rep["skipped"]))

    def test_env_preset_applies_each_setting_to_checks_and_runs(self):
        b = self.fake("qwasi", FAKE_DECODE=300, FAKE_COMMIT="b")
        rc, rep, _ = self.main("env", "--b", b, "--env", "QWASI_SLOW=1")
        self.assertEqual(rc, 0)
        self.assertEqual([v["name"] for v in rep["variants"]], ["default", "QWASI_SLOW=1"])
        calls = self.calls_made()
        self.assertEqual([c["slow"] for c in calls[:2]], [None, "1"])
        row = rep["phases"]["speed"]["summary"]["512"]
        self.assertAlmostEqual(row["QWASI_SLOW=1"]["vs_default"]["decode_tok_per_s"]["change_pct"], -10.0)
        with self.assertRaises(SystemExit):
            ab.main(["env", "--b", b, "--out", os.path.join(self.dir, "o2")])

    def test_gemv_bulk_checks_the_default_only_and_probes_two_paths(self):
        b = self.fake("qwasi", FAKE_DECODE=300, FAKE_COMMIT="b")
        rc, rep, _ = self.main("gemv-bulk", "--b", b)
        synthetic = [c["argv"] for c in self.calls_made() if "--synthetic" in c["argv"]]
        self.assertEqual(len(synthetic), 1)
        argv = synthetic[0]
        self.assertEqual(argv.count("--prompt-len"), 1)
        self.assertEqual(argv[argv.index("--prompt-len") + 1], "1000")
        self.assertEqual(argv[argv.index("--layers") + 1], "8")
        self.assertEqual(len([c for c in rep["checks"] if c["check"] == "fixtures"]), 5)
        probes = [r["variant"] for r in rep["phases"]["probe"]["runs"]]
        self.assertEqual(sorted(probes), ["bulk", "rows"])

    def test_fp8_checks_and_benches_the_fp8_model(self):
        a = self.fake("qbase", FAKE_DECODE=300, FAKE_COMMIT="a")
        b = self.fake("qwasi", FAKE_DECODE=330, FAKE_COMMIT="b")
        rc, rep, _ = self.main("fp8", "--a", a, "--b", b)
        self.assertEqual(rc, 0)
        calls = self.calls_made()
        synthetic = [c["argv"] for c in calls if "--synthetic" in c["argv"]]
        # Both verify --synthetic runs and every bench, each naming the model once.
        self.assertEqual(len(synthetic), 2 + 6)
        for argv in synthetic:
            self.assertEqual(argv.count("--synthetic"), 1)
            self.assertEqual(argv[argv.index("--synthetic") + 1], "qwen3.6-35b-a3b-fp8")
        row = rep["phases"]["speed"]["summary"]["8192"]
        self.assertAlmostEqual(row["B"]["vs_A"]["decode_tok_per_s"]["change_pct"], 10.0, places=1)

    def test_every_preset_builds_its_variants(self):
        class A:
            a, b, env = "qa", "qb", ["QWASI_X=1"]
        for name, p in ab.PRESETS.items():
            vs = p.variants(A)
            self.assertTrue(vs, name)
            self.assertEqual(len({v.name for v in vs}), len(vs), name)
            for c in p.checks:
                self.assertIn(c.kind, ("fixtures", "synthetic", "memcheck"))
                for only in c.only or []:
                    self.assertIn(only, [v.name for v in vs], name)


if __name__ == "__main__":
    unittest.main()
