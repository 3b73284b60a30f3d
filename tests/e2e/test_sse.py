"""(d) Raw SSE framing over plain HTTP (no client library)."""

from __future__ import annotations

import http.client
import json

from helpers import EXACT, MESSAGES, PROMPT, sse_events


def check_stream_headers(headers):
    ctype = headers.get("Content-Type", "")
    assert ctype.split(";")[0].strip() == "text/event-stream", ctype
    # A streamed body is chunked (or close-delimited), never a fixed length.
    assert headers.get("Content-Length") is None, headers


def test_completions_sse_framing(server, model_id):
    status, headers, body = server.request(
        "POST",
        "/v1/completions",
        {"model": model_id, "prompt": PROMPT, "max_tokens": 5, "temperature": 0,
         "stream": True, "ignore_eos": True},
    )
    assert status == 200, body
    check_stream_headers(headers)
    payloads = sse_events(body)
    chunks = [json.loads(p) for p in payloads]
    assert all(isinstance(c, dict) and "error" not in c for c in chunks), chunks
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks), "usage without include_usage"


def test_chat_sse_framing_with_usage(server, model_id):
    status, headers, body = server.request(
        "POST",
        "/v1/chat/completions",
        {"model": model_id, "messages": MESSAGES, "max_tokens": 5, "temperature": 0,
         "stream": True, "stream_options": {"include_usage": True}, **EXACT},
    )
    assert status == 200, body
    check_stream_headers(headers)
    chunks = [json.loads(p) for p in sse_events(body)]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    # include_usage: every other chunk has "usage": null.
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])


def test_sse_line_by_line(server, model_id):
    """Read line by line as a client would: data lines and blank lines alternate."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    try:
        conn.request(
            "POST",
            "/v1/completions",
            body=json.dumps({"model": model_id, "prompt": PROMPT, "max_tokens": 24,
                             "temperature": 0, "stream": True, "ignore_eos": True}),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        assert resp.status == 200
        check_stream_headers(resp.headers)
        lines = []
        while True:
            line = resp.readline()
            if not line:
                break
            lines.append(line.decode())
        text = "".join(lines)
    finally:
        conn.close()
    # Every other line is blank; the rest are data lines.
    assert lines[1::2] == ["\n"] * (len(lines) // 2)
    assert all(ln.startswith("data: ") for ln in lines[0::2])
    assert text.endswith("data: [DONE]\n\n")
    assert len(sse_events(text.encode())) >= 2


def test_non_streaming_is_json(server, model_id):
    status, headers, body = server.request(
        "POST", "/v1/completions",
        {"model": model_id, "prompt": PROMPT, "max_tokens": 2, "temperature": 0},
    )
    assert status == 200
    assert headers.get("Content-Type", "").startswith("application/json")
    assert json.loads(body)["object"] == "text_completion"
