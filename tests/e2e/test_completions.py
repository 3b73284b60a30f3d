"""(c) Text completions through the official client: max_tokens, stop, streaming."""

from __future__ import annotations

import json

import pytest
from helpers import PROMPT, token_count

EXACT = {"ignore_eos": True}


def test_completion_non_streaming(server, client, model_id):
    r = client.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=6, temperature=0, extra_body=EXACT
    )
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert r.model == model_id
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0
    assert isinstance(c.text, str)
    assert c.finish_reason == "length"
    assert c.logprobs is None
    assert r.usage.completion_tokens == 6
    assert r.usage.prompt_tokens == token_count(server, {"prompt": PROMPT})
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_max_tokens_is_respected(client, model_id):
    for n in (1, 3):
        r = client.completions.create(
            model=model_id, prompt=PROMPT, max_tokens=n, temperature=0
        )
        assert 1 <= r.usage.completion_tokens <= n
        if r.choices[0].finish_reason == "length":
            assert r.usage.completion_tokens == n


def test_completion_greedy_is_deterministic_and_prefix_stable(client, model_id):
    def run(n):
        return client.completions.create(
            model=model_id, prompt=PROMPT, max_tokens=n, temperature=0, extra_body=EXACT
        ).choices[0].text

    long = run(12)
    assert run(12) == long
    # Greedy decoding: a shorter run is a prefix of a longer one (up to a
    # multi-byte character the detokenizer may hold back at the end).
    short = run(4)
    assert long.startswith(short.rstrip("\ufffd"))


def pick_stop(text: str) -> tuple[str, str]:
    """A stop string taken from `text` and the text expected before it."""
    for i in range(1, len(text)):
        if not text[i].isspace() and text[i] != "\ufffd":
            stop = text[i : i + 2].rstrip()
            if "\ufffd" in stop:
                continue
            return stop, text[: text.find(stop)]
    return "", ""


def test_completion_stop(client, model_id):
    full = client.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=16, temperature=0, extra_body=EXACT
    )
    text = full.choices[0].text
    stop, expected = pick_stop(text)
    if not stop:
        pytest.skip(f"the demo model's output has nothing to stop on: {text!r}")
    r = client.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop, "<<never-stop-here>>"],
        extra_body=EXACT,
    )
    c = r.choices[0]
    assert c.finish_reason == "stop", (text, stop, c.text)
    assert c.text == expected, (text, stop)
    assert stop not in c.text
    assert 1 <= r.usage.completion_tokens <= 16

    # The same through the stream: the stop string never leaks into a delta.
    chunks = list(
        client.completions.create(
            model=model_id, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop,
            stream=True, extra_body=EXACT,
        )
    )
    streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert streamed == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completion_streaming(server, client, model_id):
    n = 6
    kw = dict(model=model_id, prompt=PROMPT, max_tokens=n, temperature=0, extra_body=EXACT)
    chunks = list(
        client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert len({c.id for c in chunks}) == 1
    assert all(c.object == "text_completion" for c in chunks)
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == n
    assert usage_chunk.usage.prompt_tokens == token_count(server, {"prompt": PROMPT})
    body = chunks[:-1]
    assert all(c.usage is None for c in body)
    finishes = [c.choices[0].finish_reason for c in body]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])
    text_chunks = [c for c in body if c.choices[0].text]
    assert 1 <= len(text_chunks) <= n
    streamed = "".join(c.choices[0].text for c in body)
    assert streamed == client.completions.create(**kw).choices[0].text


def test_completion_token_prompt(server, client, model_id):
    _, _, data = server.request("POST", "/tokenize", {"prompt": PROMPT})
    ids = json.loads(data)["tokens"]
    a = client.completions.create(model=model_id, prompt=ids, max_tokens=5, temperature=0,
                                  extra_body=EXACT)
    b = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=5, temperature=0,
                                  extra_body=EXACT)
    assert a.usage.prompt_tokens == len(ids)
    assert a.choices[0].text == b.choices[0].text
