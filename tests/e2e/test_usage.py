"""Usage when a stop string ends a generation: the OpenAI guest cancels the
engine request before its `finished` event, and takes the prompt and cached
counts from `generation.usage()` (WIT 0.1.2), so a prompt served from the
prefix cache reports `prompt_tokens_details.cached_tokens` > 0."""

from __future__ import annotations

import pytest
from helpers import token_count

# Its own prompt, so the first request fills the prefix cache for the second.
PROMPT = "Usage after a stop string: the second request resumes from the cache."
# Greedy, with a fixed seed and through EOS: both requests generate the same text.
SAME = dict(max_tokens=24, temperature=0, seed=1234, extra_body={"ignore_eos": True})


def stop_from(text: str) -> tuple[str, str]:
    """A stop string starting a few characters into `text` (never at its end),
    and the text expected before its first occurrence."""
    for i in range(3, len(text) - 3):
        stop = text[i : i + 3]
        if stop.strip() and "\ufffd" not in stop:
            return stop, text[: text.find(stop)]
    pytest.fail(f"the demo model's output has nothing to stop on: {text!r}")


def test_stop_string_reports_cached_tokens(server, client, model_id):
    first = client.completions.create(model=model_id, prompt=PROMPT, **SAME)
    assert first.choices[0].finish_reason == "length"
    prompt_tokens = token_count(server, {"prompt": PROMPT})
    assert first.usage.prompt_tokens == prompt_tokens
    text = first.choices[0].text
    stop, expected = stop_from(text)

    r = client.completions.create(model=model_id, prompt=PROMPT, stop=[stop], **SAME)
    c = r.choices[0]
    assert c.finish_reason == "stop", (text, stop, c.text)
    assert c.text == expected, (text, stop)
    u = r.usage
    assert u.prompt_tokens == prompt_tokens
    assert 0 < u.prompt_tokens_details.cached_tokens <= prompt_tokens, (text, stop, u)
    # The tokens the output used, up to the one that completed the stop string.
    assert 1 <= u.completion_tokens < SAME["max_tokens"], (text, stop, u)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens

    # Streamed, with the usage chunk: the same counts.
    chunks = list(
        client.completions.create(
            model=model_id, prompt=PROMPT, stop=stop, stream=True,
            stream_options={"include_usage": True}, **SAME,
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == expected
    assert chunks[-2].choices[0].finish_reason == "stop"
    su = chunks[-1].usage
    assert su.prompt_tokens == prompt_tokens
    assert su.completion_tokens == u.completion_tokens
    assert 0 < su.prompt_tokens_details.cached_tokens <= prompt_tokens, su
