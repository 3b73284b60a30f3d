#!/usr/bin/env python3
"""Writes tests/fixtures/chat/*.json: reference renderings of chat requests by
transformers' own chat-template path (render_jinja_template: the sandboxed
jinja2 environment with transformers' tojson, raise_exception, trim_blocks,
lstrip_blocks) on tests/fixtures/chat/qwen3_6_format.jinja.

The guest normalises a request's messages before templating (developer ->
system, null assistant content -> '', tool-call arguments given as a JSON
string parsed to an object; content lists are passed as sent);
`normalise` below does the same, so the fixtures pin the template's output
on exactly what the guest hands it (scripts/make_template_corpus.py uses it
too).

    pip install transformers jinja2
    python3 scripts/make_chat_fixtures.py
"""

import copy
import json
import pathlib

from transformers.utils.chat_template_utils import render_jinja_template

ROOT = pathlib.Path(__file__).resolve().parent.parent
DIR = ROOT / "tests" / "fixtures" / "chat"
TEMPLATE = (DIR / "qwen3_6_format.jinja").read_text()

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city — «quoted» & <escaped>?",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object"},
                "top": {"type": "number"},
                "safe": {"type": "boolean"},
            },
        },
    },
}

CALL_OBJ = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
}
CALL_STR = {
    "id": "call_2",
    "type": "function",
    "function": {
        "name": "search",
        "arguments": json.dumps(
            {"query": "line one\nline two", "filters": {"lang": "fr", "n": [1, 2]}, "top": 1.5, "safe": True}
        ),
    },
}

CASES = {
    "single_user": {"messages": [{"role": "user", "content": "Hi"}]},
    "system_thinking_off": {
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "multi_turn": {
        "messages": [
            {"role": "developer", "content": "Be nice."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
            {"role": "user", "content": [{"type": "text", "text": "Part one"}, {"type": "text", "text": "part two"}]},
            {"role": "assistant", "content": "Sure.", "reasoning_content": "thinking again"},
            {"role": "user", "content": "Bye"},
        ]
    },
    "no_generation_prompt": {
        "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "\nR\n"}],
        "add_generation_prompt": False,
    },
    "tools_no_system": {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER, SEARCH],
    },
    "tools_with_system": {
        "messages": [{"role": "system", "content": "Use tools wisely."}, {"role": "user", "content": "Weather?"}],
        "tools": [WEATHER],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "tool_loop": {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Weather in Paris, and search news"},
            {"role": "assistant", "content": "Let me look.", "reasoning_content": "Need two tools.", "tool_calls": [CALL_OBJ, CALL_STR]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\": \"sunny\"}"},
            {"role": "tool", "tool_call_id": "call_2", "content": "no news"},
        ],
        "tools": [WEATHER, SEARCH],
    },
    "tool_loop_no_content": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL_OBJ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [WEATHER],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "preserve_thinking": {
        "messages": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2"},
            {"role": "user", "content": "Q3"},
        ],
        "chat_template_kwargs": {"preserve_thinking": True},
    },
    "unicode_and_tool_json": {
        "messages": [
            {"role": "user", "content": "Ünïcödé 😀 \"quotes\" \\ back"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "search", "arguments": {"query": "café", "filters": {"a": None, "b": [True, 1.25, "x\ty"]}}}}
                ],
            },
            {"role": "tool", "content": "done"},
        ],
        "tools": [SEARCH],
        "chat_template_kwargs": {"enable_thinking": True, "custom_flag": 1},
    },
}


def normalise(messages):
    out = []
    for m in copy.deepcopy(messages):
        n = {"role": "system" if m["role"] == "developer" else m["role"]}
        c = m.get("content")
        n["content"] = c if c is not None else ""
        if m.get("reasoning_content") is not None:
            n["reasoning_content"] = m["reasoning_content"]
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                args = tc["function"].get("arguments") or {}
                if isinstance(args, str):
                    args = json.loads(args)
                c2 = {}
                if "id" in tc:
                    c2["id"] = tc["id"]
                c2["type"] = "function"
                c2["function"] = {"name": tc["function"]["name"], "arguments": args}
                calls.append(c2)
            n["tool_calls"] = calls
        if m["role"] == "tool" and "tool_call_id" in m:
            n["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            n["name"] = m["name"]
        out.append(n)
    return out


def render(template, case):
    """transformers' rendering of a request's conversation (as the guest hands it over)."""
    rendered, _ = render_jinja_template(
        conversations=[normalise(case["messages"])],
        tools=case.get("tools"),
        chat_template=template,
        add_generation_prompt=case.get("add_generation_prompt", True),
        **dict(case.get("chat_template_kwargs", {})),
    )
    return rendered[0]


def main():
    for old in DIR.glob("*.json"):
        old.unlink()
    for name, case in CASES.items():
        text = render(TEMPLATE, case)
        fixture = {"request": case, "expected": text}
        (DIR / f"{name}.json").write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {len(text)} chars")

if __name__ == "__main__":
    main()
