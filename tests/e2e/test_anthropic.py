"""The Anthropic Messages API end to end: the official `anthropic` client
against a real `qwasi serve` (the bundled Anthropic guest at /v1/messages,
beside the OpenAI guest at /). The demo model for shapes, streaming, usage
and errors; scripted model turns (`--scripted-turns`) where a test needs a
specific output (thinking, tool calls), with a request shaped like Claude
Code's (tests/fixtures/anthropic/claude_code_request.json)."""

from __future__ import annotations

import json

import anthropic
import pytest

from conftest import BOB_KEY, REPO
from test_tools import scripted

FIXTURE = REPO / "tests/fixtures/anthropic/claude_code_request.json"
HELLO = [{"role": "user", "content": "Name three colours."}]
# The API takes `temperature` (0-1), which the current SDK no longer lists: sent as is.
GREEDY = {"temperature": 0}


def client_for(server, api_key: str = "unused") -> anthropic.Anthropic:
    # What Claude Code does with ANTHROPIC_BASE_URL: the SDK appends /v1/messages.
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return client_for(server)


def test_create_count_tokens_and_cache_read(claude):
    kw = dict(model="claude-sonnet-4-5", max_tokens=8, messages=HELLO, system="Answer briefly.",
              extra_body=GREEDY)
    m = claude.messages.create(**kw)
    assert m.type == "message" and m.role == "assistant"
    assert m.id.startswith("msg_")
    assert m.model == "claude-sonnet-4-5"
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= m.usage.output_tokens <= 8
    assert all(b.type == "text" for b in m.content)
    n = claude.messages.count_tokens(model=kw["model"], messages=HELLO, system=kw["system"])
    assert n.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens
    # The same prompt again: read from the prefix cache.
    again = claude.messages.create(**kw)
    assert again.usage.cache_read_input_tokens > 0, again.usage
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == n.input_tokens


def test_stream_matches_the_final_message(claude):
    with claude.messages.stream(model="m", max_tokens=12, messages=HELLO, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.content[0].type == "text"
    assert final.content[0].text == text
    assert final.usage.output_tokens >= 1
    # The raw event sequence.
    events = list(claude.messages.create(model="m", max_tokens=6, messages=HELLO, stream=True,
                                         extra_body=GREEDY))
    types = [e.type for e in events]
    assert types[0] == "message_start"
    assert types[-2:] == ["message_delta", "message_stop"]
    assert types.count("content_block_start") == types.count("content_block_stop")
    assert events[-2].usage.output_tokens == 6 or events[-2].delta.stop_reason == "end_turn"


def test_errors_in_anthropic_shape(claude, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="m", max_tokens=10, messages=[])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert "text-only" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", max_tokens=100, messages=HELLO,
                               thinking={"type": "enabled", "budget_tokens": 10})
    # Missing max_tokens (sent raw: the SDK requires it).
    status, _, body = server.request("POST", "/v1/messages", {"model": "m", "messages": HELLO},
                                     headers={"anthropic-version": "2023-06-01"})
    assert status == 400
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        claude.post("/v1/messages/nope", cast_to=object, body={})


def test_x_api_key_through_the_bundled_policy(auth_server):
    ok = client_for(auth_server, BOB_KEY).messages.create(model="m", max_tokens=3, messages=HELLO)
    assert ok.usage.output_tokens >= 1
    with pytest.raises(anthropic.AuthenticationError) as e:
        client_for(auth_server, "sk-wrong").messages.create(model="m", max_tokens=3, messages=HELLO)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "authentication_error"


THINK = "The user asks about installation; read the README first.\n"
CALL = ("Let me read it.\n\n<tool_call>\n<function=Read>\n<parameter=file_path>\n/repo/README.md\n"
        "</parameter>\n<parameter=limit>\n40\n</parameter>\n</function>\n</tool_call>")
ANSWER = "Install it with `pip install qwasi`."


def test_claude_code_request_tools_round_trip():
    request = json.loads(FIXTURE.read_text())
    assert request["stream"] and request["thinking"]["type"] == "enabled"
    with scripted([THINK + "</think>\n\n" + CALL, THINK + "</think>\n\n" + ANSWER]) as s:
        claude = client_for(s)
        # Turn 1, streamed as Claude Code streams it: raw events.
        events = list(claude.messages.create(**request))
        types = [e.type for e in events]
        assert types[0] == "message_start"  # (the SDK drops the `ping` after it)
        assert types[-2:] == ["message_delta", "message_stop"]
        starts = [e.content_block for e in events if e.type == "content_block_start"]
        assert [b.type for b in starts] == ["thinking", "text", "tool_use"]
        thinking = "".join(e.delta.thinking for e in events
                           if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
        assert thinking == THINK
        text = "".join(e.delta.text for e in events
                       if e.type == "content_block_delta" and e.delta.type == "text_delta")
        assert text == "Let me read it."
        parts = [e.delta.partial_json for e in events
                 if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        assert len(parts) >= 2  # streamed as the parameters are generated
        assert json.loads("".join(parts)) == {"file_path": "/repo/README.md", "limit": 40}
        call = starts[2]
        assert call.name == "Read" and call.id.startswith("toolu_")
        assert events[-2].delta.stop_reason == "tool_use"
        assert events[0].message.usage.input_tokens > 1000  # fourteen tools rendered

        # Turn 2: the assistant turn and the tool result go back; the SDK's
        # stream helper accumulates the answer.
        request["messages"] += [
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": thinking, "signature": ""},
                {"type": "text", "text": text},
                {"type": "tool_use", "id": call.id, "name": "Read",
                 "input": {"file_path": "/repo/README.md", "limit": 40}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call.id,
                 "content": [{"type": "text", "text": "## Install\npip install qwasi"}],
                 "cache_control": {"type": "ephemeral"}}]},
        ]
        del request["stream"]
        with claude.messages.stream(**request) as st:
            final = st.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.content[1].text == ANSWER
        assert final.stop_reason == "end_turn"


def test_tool_choice_and_stop_sequences():
    tools = [{"name": "get_weather", "description": "Weather of a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    with scripted([call, "No call here.", "one two STOP three"]) as s:
        claude = client_for(s)
        m = claude.messages.create(model="m", max_tokens=200, messages=HELLO, tools=tools,
                                   tool_choice={"type": "tool", "name": "get_weather"})
        assert m.stop_reason == "tool_use"
        assert m.content[0].type == "tool_use" and m.content[0].input == {"city": "Paris"}
        # A 422 (the model broke the request's rules), which the SDK does not retry.
        with pytest.raises(anthropic.UnprocessableEntityError) as e:
            claude.messages.create(model="m", max_tokens=200, messages=HELLO, tools=tools,
                                   tool_choice={"type": "any"})
        assert e.value.body["error"]["type"] == "invalid_request_error"
        m = claude.messages.create(model="m", max_tokens=200, messages=HELLO,
                                   stop_sequences=["STOP"])
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
        assert m.content[0].text == "one two "
