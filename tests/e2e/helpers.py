"""Shared helpers of the end-to-end tests."""

from __future__ import annotations

import json

# Thinking off and EOS ignored: the demo model's output is then all `content`
# and exactly `max_tokens` long, whatever it happens to say.
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
EXACT = {**NO_THINK, "ignore_eos": True}

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three prime numbers."},
]
PROMPT = "The quick brown fox jumps over the lazy dog. Then"


def extra(obj, name):
    """A non-standard field of an openai model object (e.g. reasoning_content)."""
    value = getattr(obj, name, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(name)
    return value


def token_count(server, body: dict) -> int:
    status, _, data = server.request("POST", "/tokenize", body)
    assert status == 200, data
    out = json.loads(data)
    assert out["count"] == len(out["tokens"])
    return out["count"]


def sse_events(body: bytes) -> list[str]:
    """Splits a raw SSE body into its `data:` payloads, checking the framing:
    every event is exactly one `data: ` line followed by a blank line, and
    the stream ends with `data: [DONE]`."""
    text = body.decode("utf-8")
    assert "\r" not in text, "SSE events must be separated by \\n\\n"
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-80:]!r}"
    events = text[:-2].split("\n\n")
    payloads = []
    for ev in events:
        assert ev, f"empty event (extra blank line) in {text[:200]!r}"
        assert "\n" not in ev, f"multi-line event: {ev!r}"
        assert ev.startswith("data: "), f"event without `data: `: {ev!r}"
        payloads.append(ev[len("data: "):])
    assert payloads[-1] == "[DONE]", f"last event is {payloads[-1]!r}"
    assert "[DONE]" not in payloads[:-1], "[DONE] before the end"
    return payloads[:-1]
