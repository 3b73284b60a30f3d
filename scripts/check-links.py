#!/usr/bin/env python3
"""Checks the links and repository paths in the Markdown files of the repository.

    python3 scripts/check-links.py [FILE.md ...]

Without arguments: every Markdown file git tracks or would track (untracked but
not ignored). In each file it checks
  - relative links, `[text](path)`, `[text](path#anchor)`, `![alt](path)` and
    `[ref]: path`: the file or directory exists, relative to the Markdown file
    (a leading / means the repository root); an anchor must be a heading of the
    target Markdown file (GitHub's slugs), `#anchor` alone one of this file;
  - paths named in the text or in code, such as `benchmarks/speed-h200-a7b33d3.json`
    or scripts/device/bench.sh: words that start with a top-level directory of
    the repository (benchmarks/, docs/, scripts/, host/, kernels/, tests/,
    examples/, guests/, wit/, .ci/) must exist from the repository root. Build
    outputs (a target/ component) and patterns (followed by <, {, * or …, or
    ending in - or _) are not paths and are skipped;
  - Markdown files named without a directory (`PERFORMANCE.md`): beside the
    file or at the repository root.
Links to other sites (http:, https:, mailto:) are not fetched. Prints one line
per broken link (file:line: what) and exits 1 if there is any. CI runs it.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = ("benchmarks", "docs", "scripts", "host", "kernels", "tests", "examples", "guests", "wit", ".ci")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
REF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*)" % "|".join(re.escape(t) for t in TOP))
BARE_MD = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")
FENCE = re.compile(r"^\s*(```|~~~)")


def markdown_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [os.path.join(ROOT, f) for f in out.splitlines() if os.path.exists(os.path.join(ROOT, f))]


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    h = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, out, fenced = {}, set(), False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE.match(line):
                    fenced = not fenced
                m = None if fenced else re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    s = slug(m.group(1))
                    n = seen.get(s, 0)
                    seen[s] = n + 1
                    out.add(s if n == 0 else f"{s}-{n}")
        _anchors[path] = out
    return _anchors[path]


def check_link(md, target):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
        return None
    path, _, anchor = target.partition("#")
    if not path:
        dest = md
    elif path.startswith("/"):
        dest = os.path.join(ROOT, path.lstrip("/"))
    else:
        dest = os.path.normpath(os.path.join(os.path.dirname(md), path))
    if not os.path.exists(dest):
        return f"link to {target}: {os.path.relpath(dest, ROOT)} does not exist"
    if anchor and dest.endswith(".md") and anchor.lower() not in anchors(dest):
        return f"link to {target}: no heading #{anchor} in {os.path.relpath(dest, ROOT)}"
    return None


def check_path(line, m):
    p = m.group(1).rstrip(".,")
    after = line[m.end():m.end() + 1]
    if after in ("<", "{", "*", "…") or p.endswith(("-", "_")) or "/target/" in f"/{p}/":
        return None
    if not os.path.exists(os.path.join(ROOT, p)):
        return f"path {p} does not exist"
    return None


def check_bare_md(md, name):
    """A Markdown file named without a directory: beside this one or at the root."""
    if os.path.exists(os.path.join(os.path.dirname(md), name)) or os.path.exists(os.path.join(ROOT, name)):
        return None
    return f"{name} does not exist beside {os.path.relpath(md, ROOT)} or at the repository root"


def check_file(md):
    errors = []
    with open(md, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        found = [check_link(md, m.group(1)) for m in LINK.finditer(line)]
        m = REF.match(line)
        if m:
            found.append(check_link(md, m.group(1)))
        text = LINK_TARGET.sub("]", line)  # link targets were checked above, as links
        found += [check_path(text, m) for m in PATH.finditer(text)]
        found += [check_bare_md(md, m.group(1)) for m in BARE_MD.finditer(text)]
        errors += [f"{os.path.relpath(md, ROOT)}:{n}: {e}" for e in dict.fromkeys(found) if e]
    return errors


def main(argv):
    files = [os.path.abspath(f) for f in argv] or markdown_files()
    errors = [e for md in files for e in check_file(md)]
    for e in errors:
        print(e)
    print(f"check-links: {len(files)} Markdown files, "
          + (f"{len(errors)} broken" if errors else "every link and path exists"), file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
