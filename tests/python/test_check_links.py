"""scripts/check-links.py finds what it must and passes what it must not flag.
Standard library only (CI runs it).

Run: python3 -m unittest discover -s tests/python -p 'test_check_links.py'
"""
import importlib.util
import os
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("check_links", os.path.join(ROOT, "scripts/check-links.py"))
cl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cl)


class CheckLinksTest(unittest.TestCase):
    def check(self, text):
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "other.md"), "w").write("# Other\n\n## Where the time goes\n")
            md = os.path.join(d, "doc.md")
            open(md, "w").write(text)
            return cl.check_file(md)

    def test_broken_links_and_paths_are_reported(self):
        errors = self.check(
            "# Doc\n"
            "[gone](missing.md) and [anchor](other.md#nowhere) and [self](#no-such)\n"
            "`benchmarks/no-such-record.json`, scripts/device/no_such.sh\n"
            "MODEL.md explains why\n"
            "[ref]: ../nowhere/x.md\n")
        text = "\n".join(errors)
        for what in ("missing.md", "#nowhere", "#no-such", "benchmarks/no-such-record.json",
                     "scripts/device/no_such.sh", "MODEL.md", "../nowhere/x.md"):
            self.assertIn(what, text)
        self.assertEqual(len(errors), 7, text)

    def test_valid_links_patterns_and_other_sites_pass(self):
        errors = self.check(
            "# Doc\n## Sub `code` section\n"
            "[ok](other.md) [anchor](other.md#where-the-time-goes) [here](#sub-code-section)\n"
            "[site](https://example.com/x.md) [mail](mailto:a@b.c)\n"
            "`benchmarks/README.md`, benchmarks/history/, scripts/device/ab.py.\n"
            "`benchmarks/speed-<backend>.json`, `benchmarks/prefix-cache-h200-131k-{bf16kv-,}x.json`\n"
            "guests/target/wasm32-wasip2/release/x.wasm, `benchmarks/speed-h200-…`\n"
            "```\n# not a heading\n```\n"
            "other.md and README.md\n")
        self.assertEqual(errors, [])

    def test_the_repository_passes(self):
        self.assertEqual(cl.main([]), 0)


if __name__ == "__main__":
    unittest.main()
