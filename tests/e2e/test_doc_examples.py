"""Every `curl` example of README.md and docs/API.md, run as written against
the demo model: the request must succeed, and where the example shows its
answer (a `# {...}` line after it) the answer must be that JSON.

The README's examples name the model `Qwen3.6-35B-A3B` (the id a directory of
that name is served under), so the server here also answers to it
(`--served-model-name`). Examples with a placeholder (`…`) or an environment
variable, and the /admin paths, are left out."""

from __future__ import annotations

import json
import re
import shlex
from urllib.parse import urlsplit

import pytest
from conftest import REPO, Server

DOCS = [REPO / "README.md", REPO / "docs" / "API.md"]


def examples():
    """(doc, command, expected JSON or None) for each curl command in a sh block."""
    out = []
    for doc in DOCS:
        blocks = re.findall(r"```sh\n(.*?)```", doc.read_text(), re.S)
        for block in blocks:
            lines = block.split("\n")
            i = 0
            while i < len(lines):
                line = lines[i]
                i += 1
                if not line.startswith("curl "):
                    continue
                cmd = line
                # Continued lines: a trailing backslash or an open single quote.
                while (cmd.endswith("\\") or cmd.count("'") % 2) and i < len(lines):
                    cmd = (cmd[:-1] if cmd.endswith("\\") else cmd + "\n") + lines[i]
                    i += 1
                expected = None
                if i < len(lines) and lines[i].startswith("# {"):
                    expected = json.loads(lines[i][2:])
                out.append((doc.name, cmd, expected))
    return out


def parse(cmd):
    args = shlex.split(cmd)
    method, body, url = None, None, None
    it = iter(args[1:])
    for a in it:
        if a == "-X":
            method = next(it)
        elif a in ("-d", "--data"):
            body = next(it)
        elif a == "-H":
            next(it)
        elif not a.startswith("-"):
            url = a
    if "://" not in url:
        url = "http://" + url
    path = urlsplit(url).path or "/"
    return method or ("POST" if body is not None else "GET"), path, body


RUNNABLE = [e for e in examples() if "…" not in e[1] and "$" not in e[1] and "/admin/" not in e[1]]


@pytest.fixture(scope="module")
def doc_server():
    s = Server(["--served-model-name", "qwasi-demo", "--served-model-name", "Qwen3.6-35B-A3B"], "docs").start()
    yield s
    s.stop()


def test_the_docs_have_examples():
    assert len(RUNNABLE) >= 9, RUNNABLE


@pytest.mark.parametrize("doc,cmd,expected", RUNNABLE, ids=[f"{d}:{c.split()[1]}" for d, c, _ in RUNNABLE])
def test_doc_example_runs(doc_server, doc, cmd, expected):
    method, path, body = parse(cmd)
    if body is not None:
        json.loads(body)  # the example's body is valid JSON
    status, _, data = doc_server.request(method, path, body)
    assert status == 200, f"{doc}: {cmd}\n-> {status} {data[:500]!r}"
    if expected is not None:
        assert json.loads(data) == expected, f"{doc}: {cmd}"
