"""The chat-template fixtures re-rendered live by transformers' own Jinja2
environment: tests/fixtures/templates/corpus.json and tests/fixtures/chat/*.json
must be what scripts/make_template_corpus.py and scripts/make_chat_fixtures.py
write now, so the byte-for-byte comparison the guest's native tests make
(guests/openai/src/template_corpus.rs over guests/sdk/src/template.rs) is against transformers,
not against a stale file. Needs no server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import make_chat_fixtures  # noqa: E402
import make_template_corpus  # noqa: E402


def test_template_corpus_is_transformers_output():
    committed = json.loads(make_template_corpus.OUT.read_text())
    live = json.loads(json.dumps(make_template_corpus.corpus()))
    assert committed["conversations"] == live["conversations"], "rerun scripts/make_template_corpus.py"
    for template, renders in live["renders"].items():
        assert template in committed["renders"], f"{template}: rerun scripts/make_template_corpus.py"
        for conv, want in renders.items():
            assert committed["renders"][template][conv] == want, f"{template} × {conv} drifted from transformers"
    # The two shapes of issue 24 render (no error) with the Qwen3.6-style template.
    qwen = live["renders"]["qwen3_6_style"]
    assert "<|im_start|>user\n<tool_response>\nsunny" in qwen["one_call_one_result"]["text"]
    assert "</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>" in qwen["two_calls_two_results"]["text"]


def test_chat_fixtures_are_transformers_output():
    for name, case in make_chat_fixtures.CASES.items():
        committed = json.loads((make_chat_fixtures.DIR / f"{name}.json").read_text())
        rendered = make_chat_fixtures.render(make_chat_fixtures.TEMPLATE, case)
        assert committed["expected"] == rendered, f"{name} drifted: rerun scripts/make_chat_fixtures.py"
