#!/usr/bin/env python3
"""Writes tests/fixtures/templates/corpus.json: every template of
tests/fixtures/templates/*.jinja (written for Qwasi: the Jinja that real chat
templates use, and a Qwen3.6-style template with the shapes of the one Qwen
ships) rendered over every conversation below by transformers' own
chat-template path (`render_jinja_template`: jinja2's
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols,
transformers' tojson and raise_exception).

The OpenAI guest's test (guests/openai/src/template_corpus.rs, over the SDK's
renderer guests/sdk/src/template.rs) renders the same pairs and compares byte
for byte; tests/e2e/test_template_corpus.py
re-runs this script's rendering in CI and compares it with the committed file,
so the fixtures cannot drift from transformers.

    pip install transformers jinja2     # scripts/ci-deps.sh installs both
    python3 scripts/make_template_corpus.py
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import make_chat_fixtures  # noqa: E402
from make_chat_fixtures import CALL_OBJ, CALL_STR, SEARCH, WEATHER  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DIR = ROOT / "tests" / "fixtures" / "templates"
OUT = DIR / "corpus.json"


def call(i, name, args):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


Q = {"role": "user", "content": "Weather in Paris and Rome?"}
TWO_CALLS = {"role": "assistant", "content": "", "tool_calls": [call(1, "get_weather", {"city": "Paris"}), call(2, "get_weather", '{"city": "Rome", "days": 3}')]}
PARTS = [{"type": "text", "text": "First part."}, {"type": "text", "text": " Second part\n"}]

CONVERSATIONS = {
    "single_user": {"messages": [{"role": "user", "content": "Hi"}]},
    "system_user": {"messages": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "2+2?"}], "chat_template_kwargs": {"enable_thinking": False}},
    "developer_role": {"messages": [{"role": "developer", "content": "Rules."}, {"role": "user", "content": "ok?"}]},
    # The two shapes of issue 24: a tool result after one call; two calls, two results.
    "one_call_one_result": {
        "messages": [Q, {"role": "assistant", "content": None, "tool_calls": [CALL_OBJ]}, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        "tools": [WEATHER],
    },
    "two_calls_two_results": {
        "messages": [Q, TWO_CALLS, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}, {"role": "tool", "tool_call_id": "call_2", "content": "rain"}],
        "tools": [WEATHER],
    },
    "tool_loop_continues": {
        "messages": [
            {"role": "system", "content": "Use tools."},
            Q,
            {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two cities, two calls.", "tool_calls": TWO_CALLS["tool_calls"]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\": \"sunny\"}"},
            {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
            {"role": "assistant", "content": "<think>\nBoth known.\n</think>\n\nParis sunny, Rome rain."},
            {"role": "user", "content": "And tomorrow?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL_STR]},
            {"role": "tool", "tool_call_id": "call_2", "content": "nothing"},
        ],
        "tools": [WEATHER, SEARCH],
        "chat_template_kwargs": {"enable_thinking": True},
    },
    "reasoning_history": {
        "messages": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "\nR1\n"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "<think>R2</think>\n\nA2"},
            {"role": "user", "content": "Q3"},
            {"role": "assistant", "content": "A3 so far", "reasoning_content": "R3"},
        ],
        "add_generation_prompt": False,
    },
    "preserve_thinking": {
        "messages": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "Q2"},
        ],
        "chat_template_kwargs": {"preserve_thinking": True, "custom_flag": [1, "x"]},
    },
    "content_parts": {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "System in parts."}]},
            {"role": "user", "content": PARTS},
            {"role": "assistant", "content": [{"type": "text", "text": "Answer in parts."}]},
            {"role": "user", "content": [{"type": "text", "text": "again"}]},
        ],
    },
    "tool_args_types": {
        "messages": [
            {"role": "user", "content": "Ünïcödé 😀 \"quotes\" \\ back\ttab"},
            {"role": "assistant", "content": "Let me search.", "tool_calls": [call(7, "search", {"query": "café", "filters": {"a": None, "b": [True, 1.25, "x\ty"]}, "top": 3, "ratio": 0.5, "safe": False, "empty": "", "list": []})]},
            {"role": "tool", "tool_call_id": "call_7", "content": "done"},
        ],
        "tools": [SEARCH],
    },
    "system_not_first": {"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "late"}]},
    "no_user_query": {"messages": [{"role": "system", "content": "S"}, {"role": "assistant", "content": "A"}]},
    "tool_first": {"messages": [{"role": "tool", "content": "orphan"}, {"role": "user", "content": "then a question"}]},
    "named_messages": {
        "messages": [{"role": "user", "content": "hi", "name": "alice"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "  spaced  \n"}],
        "tools": [WEATHER, SEARCH],
        "chat_template_kwargs": {"enable_thinking": False},
    },
}


def render(template, case):
    from jinja2.exceptions import TemplateError

    try:
        return {"text": make_chat_fixtures.render(template, case)}
    except (TemplateError, TypeError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}

def corpus():
    templates = {p.stem: p.read_text() for p in sorted(DIR.glob("*.jinja"))}
    renders = {t: {c: render(src, case) for c, case in CONVERSATIONS.items()} for t, src in templates.items()}
    return {"conversations": CONVERSATIONS, "renders": renders}


def main():
    data = corpus()
    OUT.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    for t, rs in data["renders"].items():
        errors = sum("error" in r for r in rs.values())
        print(f"{t}: {len(rs)} conversations, {errors} errors")


if __name__ == "__main__":
    main()
