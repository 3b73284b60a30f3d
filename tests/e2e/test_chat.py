"""(a)/(b) Chat completions through the official client, JSON and streaming."""

from __future__ import annotations

from helpers import EXACT, MESSAGES, NO_THINK, extra, token_count


def prompt_tokens(server, messages, enable_thinking: bool) -> int:
    return token_count(
        server,
        {"messages": messages, "chat_template_kwargs": {"enable_thinking": enable_thinking}},
    )


def test_chat_non_streaming(server, client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=8, temperature=0, extra_body=EXACT
    )
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == model_id
    assert isinstance(r.created, int) and r.created > 1_600_000_000
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    # ignore_eos: exactly max_tokens tokens, so "length".
    assert choice.finish_reason == "length"
    u = r.usage
    assert u.completion_tokens == 8
    assert u.prompt_tokens == prompt_tokens(server, MESSAGES, enable_thinking=False)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details is not None
    assert 0 <= u.prompt_tokens_details.cached_tokens <= u.prompt_tokens


def test_chat_default_thinking_structure(server, client, model_id):
    """Thinking on (the default): reasoning_content and/or content, any finish."""
    r = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=12, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length")
    content = choice.message.content
    reasoning = extra(choice.message, "reasoning_content")
    assert content is not None
    assert reasoning is None or isinstance(reasoning, str)
    assert 1 <= r.usage.completion_tokens <= 12
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens == prompt_tokens(server, MESSAGES, enable_thinking=True)


def test_chat_greedy_is_deterministic(client, model_id):
    outs = [
        client.chat.completions.create(
            model=model_id, messages=MESSAGES, max_tokens=10, temperature=0, extra_body=NO_THINK
        )
        for _ in range(2)
    ]
    a, b = (o.choices[0] for o in outs)
    assert a.message.content == b.message.content
    assert a.finish_reason == b.finish_reason
    assert outs[0].usage.completion_tokens == outs[1].usage.completion_tokens


def test_chat_seeded_sampling_is_deterministic(client, model_id):
    kw = dict(model=model_id, messages=MESSAGES, max_tokens=10, temperature=0.8, seed=1234,
              extra_body=EXACT)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def collect_stream(stream):
    chunks = list(stream)
    assert chunks, "empty stream"
    return chunks


def test_chat_streaming(server, client, model_id):
    max_tokens = 8
    kw = dict(model=model_id, messages=MESSAGES, max_tokens=max_tokens, temperature=0,
              extra_body=EXACT)
    chunks = collect_stream(
        client.chat.completions.create(
            **kw, stream=True, stream_options={"include_usage": True}
        )
    )
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.model == model_id for c in chunks)

    # The last chunk carries the usage and no choices; all others usage null.
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    body = chunks[:-1]

    # First chunk: the role.
    first = body[0].choices[0]
    assert first.index == 0
    assert first.delta.role == "assistant"
    assert first.finish_reason is None

    # Exactly one finish_reason, on the last choice chunk.
    finishes = [c.choices[0].finish_reason for c in body]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])
    assert all(len(c.choices) == 1 for c in body)

    content = "".join(c.choices[0].delta.content or "" for c in body)
    reasoning = "".join(extra(c.choices[0].delta, "reasoning_content") or "" for c in body)
    assert reasoning == ""  # thinking off
    deltas = [c for c in body[1:-1] if c.choices[0].delta.content]
    assert 1 <= len(deltas) <= max_tokens

    u = usage_chunk.usage
    assert u.completion_tokens == max_tokens
    assert u.prompt_tokens == prompt_tokens(server, MESSAGES, enable_thinking=False)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens

    # Same greedy request without streaming: same text, same counts.
    r = client.chat.completions.create(**kw)
    assert r.choices[0].message.content == content
    assert r.usage.completion_tokens == u.completion_tokens
    assert r.usage.prompt_tokens == u.prompt_tokens


def test_chat_streaming_without_usage(client, model_id):
    chunks = collect_stream(
        client.chat.completions.create(
            model=model_id, messages=MESSAGES, max_tokens=4, temperature=0,
            extra_body=EXACT, stream=True,
        )
    )
    assert all(c.usage is None for c in chunks)
    assert all(len(c.choices) == 1 for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_streaming_with_thinking(client, model_id):
    """Thinking on: reasoning and content deltas together equal the JSON answer."""
    kw = dict(model=model_id, messages=MESSAGES, max_tokens=12, temperature=0)
    chunks = collect_stream(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    body = chunks[:-1]
    content = "".join(c.choices[0].delta.content or "" for c in body)
    reasoning = "".join(extra(c.choices[0].delta, "reasoning_content") or "" for c in body)
    r = client.chat.completions.create(**kw)
    assert content == (r.choices[0].message.content or "")
    assert reasoning == (extra(r.choices[0].message, "reasoning_content") or "")
    assert body[-1].choices[0].finish_reason == r.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
