"""Tool calling end to end: the official `openai` client against a real
`qwasi serve` whose model turns are scripted (`--scripted-turns`: the engine
forces the given text, tokenized by the model's tokenizer, one turn per
request). Server, guests, tokenizer, sampling and HTTP are real."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import pytest

from conftest import Server

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

CALL_TURN = (
    "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
)


@contextlib.contextmanager
def scripted(turns: list[str]):
    path = Path(tempfile.mkdtemp(prefix="qwasi-e2e-turns-")) / "turns.json"
    path.write_text(json.dumps(turns))
    s = Server(["--scripted-turns", str(path), "--prefix-cache-mib", "0"], "scripted").start()
    try:
        yield s
    finally:
        s.stop()


def test_tool_loop_streamed():
    with scripted([CALL_TURN, "It is sunny in Paris."]) as s:
        client = s.client()
        model = client.models.list().data[0].id
        messages = [{"role": "user", "content": "Weather in Paris for 2 days?"}]
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=[WEATHER_TOOL],
            stream=True,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        content, calls, finish = "", {}, None
        name_chunk = args_chunk = None
        for i, chunk in enumerate(stream):
            choice = chunk.choices[0]
            d = choice.delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    c["id"] = tc.id
                    assert tc.type == "function"
                if tc.function and tc.function.name:
                    c["name"] += tc.function.name
                    name_chunk = i if name_chunk is None else name_chunk
                if tc.function and tc.function.arguments:
                    c["arguments"] += tc.function.arguments
                    args_chunk = i if args_chunk is None else args_chunk
            finish = choice.finish_reason or finish
        assert finish == "tool_calls"
        assert content == "I will check."
        assert list(calls) == [0]
        call = calls[0]
        assert call["id"].startswith("call_")
        assert call["name"] == "get_weather"
        assert json.loads(call["arguments"]) == {"city": "Paris", "days": 2}
        assert name_chunk < args_chunk  # the name streams before the arguments

        # The tool result goes back; the prompt is the old prompt + the output.
        messages.append(
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    {"id": call["id"], "type": "function",
                     "function": {"name": call["name"], "arguments": call["arguments"]}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "sunny"}'})
        final = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=[WEATHER_TOOL],
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        assert final.choices[0].finish_reason == "stop"
        assert final.choices[0].message.content == "It is sunny in Paris."
        assert not final.choices[0].message.tool_calls

        # /tokenize renders the same chat: turn 1's prompt + output is a prefix of turn 2's.
        def rendered(msgs, **kw):
            status, _, body = s.request("POST", "/tokenize", {"model": model, "messages": msgs, "tools": [WEATHER_TOOL],
                                                              "chat_template_kwargs": {"enable_thinking": False}, **kw})
            assert status == 200, body
            return json.loads(body)["tokens"]

        t1 = rendered(messages[:1])
        t2 = rendered(messages)
        assert t2[: len(t1)] == t1


def test_non_streaming_thinking_and_tool_call():
    turn = "The user wants weather.\n</think>\n\n" + CALL_TURN.split("\n\n", 1)[1]
    with scripted([turn]) as s:
        client = s.client()
        r = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER_TOOL],
            tool_choice="required",
        )
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls"
        assert m.content is None
        assert getattr(m, "reasoning_content", None) == "The user wants weather.\n"
        assert m.tool_calls[0].function.name == "get_weather"
        assert json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris", "days": 2}


def test_tool_choice_required_overrides_the_model():
    # The script never calls a tool; `required` constrains the decoding to a
    # call anyway (never a 500 for what the model chose).
    pick = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"c": {"type": "string", "enum": ["x", "y"]}}, "required": ["c"]}}}
    with scripted(["No tools for me."]) as s:
        client = s.client()
        r = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "Pick one."}],
            tools=[pick],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=40,
            extra_body={"enable_thinking": False},
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert [t.function.name for t in c.message.tool_calls] == ["pick"]
        assert json.loads(c.message.tool_calls[0].function.arguments)["c"] in ("x", "y")
