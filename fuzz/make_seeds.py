#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/TARGET/seed-*):
valid requests of every endpoint (the chat fixtures included), model outputs
with tool-call markup, stream-writer op sequences and token-id runs. libFuzzer
mutates from these; crashes it finds are added beside them by hand
(fuzz/corpus/TARGET/crash-*), so they are replayed on every run.

    python3 fuzz/make_seeds.py
"""

import json
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
CORPUS = ROOT / "corpus"

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                          "days": {"type": "integer"}},
                         "required": ["city"]}}}]

CHAT = [json.load(open(p))["request"] for p in sorted((REPO / "tests/fixtures/chat").glob("*.json"))]
CHAT += [
    {"model": "qwen3.6", "messages": [{"role": "user", "content": "Hi"}], "stream": True,
     "stream_options": {"include_usage": True}, "max_tokens": 5},
    {"model": "qwen", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
     "n": 2, "logprobs": True, "top_logprobs": 2, "stop": ["STOP"], "seed": 1, "temperature": 0.5},
    {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "tool_choice": "required",
     "stream": True, "parallel_tool_calls": False},
    {"messages": [{"role": "user", "content": "json"}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
         "type": "object", "properties": {"a": {"type": "integer"}}}}}},
    {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": False},
     "max_completion_tokens": 3, "presence_penalty": 0.5, "logit_bias": {"65": 1}},
]
COMPLETIONS = [
    {"model": "qwen3.6", "prompt": "Once upon", "max_tokens": 4},
    {"prompt": ["a", "b"], "n": 2, "echo": True, "logprobs": 2, "stream": True, "suffix": "x"},
    {"prompt": [1, 2, 3], "best_of": 2, "stop": "STOP"},
    {"prompt": [[65, 66], [67]], "max_tokens": 1, "stream": True},
]
RESPONSES = [
    {"model": "qwen3.6", "input": "Hi", "max_output_tokens": 5},
    {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
     "instructions": "Be brief", "stream": True},
    {"input": [{"type": "message", "role": "user", "content": "w"},
               {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"P\"}"},
               {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
     "tools": [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}],
     "reasoning": {"effort": "low"}, "text": {"format": {"type": "json_object"}}},
]
TOKENIZE = [{"prompt": "Hello world"}, {"messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS,
                                        "add_generation_prompt": True}]
DETOKENIZE = [{"tokens": [72, 105, 0x110003]}, {"tokens": []}]
MESSAGES = [
    {"model": "qwen3.6", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]},
    {"model": "qwen3.6", "max_tokens": 16, "system": [{"type": "text", "text": "S"}], "stream": True,
     "messages": [{"role": "user", "content": [{"type": "text", "text": "weather?"}]}],
     "tools": [{"name": "get_weather", "description": "Weather",
                "input_schema": TOOLS[0]["function"]["parameters"]}],
     "tool_choice": {"type": "auto"}, "thinking": {"type": "enabled", "budget_tokens": 1024}},
    {"model": "qwen3.6", "max_tokens": 8, "stop_sequences": ["STOP"], "messages": [
        {"role": "user", "content": "w"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""},
                                          {"type": "tool_use", "id": "tu_1", "name": "get_weather",
                                           "input": {"city": "P"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "sunny"}]}]},
]
ANTHROPIC_FIXTURE = REPO / "tests/fixtures/anthropic/claude_code_request.json"

OUTPUTS = [
    "plain text, no calls",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "Sure.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}\n</tool_call>"
    "\n<tool_call>\n<function=f>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nunterminated",
    "a <tool_ b </tool_call> <function=x> é\u00e9 \U0001F600",
]


def write(target: str, name: str, data: bytes) -> None:
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data)


def body(v) -> bytes:
    return json.dumps(v).encode()


def main() -> None:
    routes = [(0, CHAT), (1, COMPLETIONS), (2, RESPONSES), (3, TOKENIZE), (4, DETOKENIZE)]
    for route, reqs in routes:
        for i, r in enumerate(reqs):
            for flags in (0, 1, 3):  # built-in / jinja template; output script
                write("openai_api", f"{route}-{i}-{flags}", bytes([route, flags + 2 * i]) + body(r))
    for route in (5, 6, 7):
        write("openai_api", f"{route}", bytes([route, 0]))
    messages = MESSAGES + ([json.load(open(ANTHROPIC_FIXTURE))] if ANTHROPIC_FIXTURE.exists() else [])
    for i, r in enumerate(messages):
        for flags in (0, 1, 2, 4):
            write("anthropic_api", f"{i}-{flags}", bytes([flags + 4 * i]) + body(r))
    for i, r in enumerate(CHAT):
        write("chat_template", f"{i}", body(r))
    for i, t in enumerate(OUTPUTS):
        write("toolcall_stream", f"{i}", bytes([3, 2, 9, 30, i & 1]) + t.encode())
    # sse_writer: flags, threshold, [fail-after], then ops (0 named event,
    # 1 JSON object, 2 flush, 3 [DONE], 4 JSON string), each text length-prefixed.
    def text(s: str) -> bytes:
        b = s.encode()[:255]
        return bytes([len(b)]) + b
    ops = bytes([0]) + text("message_start") + text('{"a":1}\nline\r\nx') + bytes([2, 1]) + text("hi") \
        + b"\x01\x00\x00" + bytes([4]) + text("tab\tnl\n") + bytes([3])
    write("sse_writer", "sse", bytes([0, 0]) + ops)
    write("sse_writer", "sse-each", bytes([4, 2]) + ops)
    write("sse_writer", "ndjson", bytes([1, 1]) + bytes([1]) + text("x") + b"\x00\x00\x00" + bytes([2, 4]) + text("y"))
    write("sse_writer", "disconnect", bytes([6, 0, 2]) + ops * 3)
    # detokenizer: skip flag, then 24-bit little-endian ids (even: id*2 in
    # the vocabulary; odd: near its top, the special tokens and past them).
    def ids(xs, top=False):
        return b"".join(struct.pack("<I", (x * 2 + (1 if top else 0)))[:3] for x in xs)
    write("detokenizer", "ascii", bytes([0]) + ids([9707, 1879, 0, 13]))
    write("detokenizer", "bytes", bytes([0]) + ids([100, 161, 102, 234, 247, 220]))
    write("detokenizer", "special", bytes([1]) + ids([5, 10, 20, 39, 60], top=True) + ids([9707]))


if __name__ == "__main__":
    main()
