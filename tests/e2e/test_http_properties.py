"""HTTP-level property test: generated requests against the real server.

Hypothesis builds a few thousand requests for every API route: valid ones,
valid ones with one field replaced by a wrong type, an out-of-range or an odd
value (deep nesting, huge strings, control characters, lone surrogates,
huge numbers), extra unknown fields, bodies that are not JSON at all, wrong
methods and content types. Whatever comes in, the server must answer with a
2xx or a 4xx in the API's own error shape, never a 5xx, and never hang: every
response, streamed ones included, ends within the timeout. A 2xx stream must
end properly (`[DONE]` for OpenAI streams, `message_stop` for Anthropic ones).

QWASI_PROPERTY_EXAMPLES sets the examples per route (default 400).
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import socket

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("QWASI_PROPERTY_EXAMPLES", "400"))
TIMEOUT = 120
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    # No shrinking: a failure reports the request as generated, and CI's
    # time is not spent minimising it against a live server.
    phases=[Phase.explicit, Phase.generate],
)

# ---------------------------------------------------------------- values
# Scalars and containers of every JSON type, odd ones included.
class Long(str):
    """A long string that Hypothesis reports by its length, not its text."""

    def __repr__(self) -> str:
        return f"{self[:1]!r} * {len(self)}"


ODD_STRINGS = st.sampled_from([
    "", " ", "\x00", "\ud800", "\udfff", "\ufffd", "<|im_start|>", "<|im_end|>", "<think>",
    "</think>", "<tool_call>\n<function=f>\n</function>\n</tool_call>", "{{ raise_exception('x') }}",
    "{% for %}", "\r\n\r\n", "data: [DONE]\n\n", "\u00e9" * 300, "\U0001F600" * 50, "\t\x1b[31m",
    "null", "1e999", Long("a" * 4096), Long("a" * 20_000),
])
STRINGS = st.one_of(st.text(max_size=40), ODD_STRINGS)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1, 2**31, 2**32, 2**53 + 1, 2**64, 1e308, -0.0, 5e-324]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, STRINGS)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(STRINGS, inner, max_size=4)
    ),
    max_leaves=12,
)


def deep(n: int) -> object:
    v: object = "x"
    for _ in range(n):
        v = [v] if n % 2 else {"a": v}
    return v


ODD_VALUES = st.one_of(JSON, st.sampled_from([deep(64), deep(401), ["x"] * 5000]))

# --------------------------------------------------------- valid requests
SMALL = st.integers(min_value=1, max_value=6)
NO_THINK = {"enable_thinking": False}
TEXT = st.one_of(st.text(min_size=1, max_size=60), ODD_STRINGS)
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}


@st.composite
def chat_body(draw) -> dict:
    messages = [{"role": "user", "content": draw(TEXT)}]
    if draw(st.booleans()):
        messages.insert(0, {"role": "system", "content": draw(TEXT)})
    if draw(st.booleans()):
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": draw(TEXT)})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": draw(TEXT)},
        ]
    body = {"model": "qwasi-demo", "messages": messages, "max_tokens": draw(SMALL),
            "chat_template_kwargs": NO_THINK}
    optional = {
        "stream": st.booleans(), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
        "n": st.integers(1, 2), "logprobs": st.booleans(), "top_logprobs": st.integers(0, 3),
        "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3)), "seed": st.integers(0, 2**32),
        "tools": st.just([TOOL]), "tool_choice": st.sampled_from(["auto", "none", "required"]),
        "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
        "stream_options": st.just({"include_usage": True}),
    }
    for k in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)):
        body[k] = draw(optional[k])
    return body


@st.composite
def completion_body(draw) -> dict:
    prompt = draw(st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=2),
                            st.lists(st.integers(0, 300), min_size=1, max_size=8)))
    body = {"model": "qwasi-demo", "prompt": prompt, "max_tokens": draw(SMALL)}
    optional = {"stream": st.booleans(), "echo": st.booleans(), "logprobs": st.integers(0, 3),
                "n": st.integers(1, 2), "stop": TEXT, "temperature": st.floats(0, 2)}
    for k in draw(st.lists(st.sampled_from(sorted(optional)), max_size=3, unique=True)):
        body[k] = draw(optional[k])
    return body


@st.composite
def responses_body(draw) -> dict:
    inp = draw(st.one_of(TEXT, st.just([{"role": "user", "content": [
        {"type": "input_text", "text": "hi"}]}])))
    body = {"model": "qwasi-demo", "input": inp, "max_output_tokens": draw(SMALL),
            "reasoning": {"effort": "none"}}
    optional = {"stream": st.booleans(), "instructions": TEXT, "temperature": st.floats(0, 2),
                "tools": st.just([{"type": "function", "name": "get_weather",
                                   "parameters": TOOL["function"]["parameters"]}])}
    for k in draw(st.lists(st.sampled_from(sorted(optional)), max_size=2, unique=True)):
        body[k] = draw(optional[k])
    return body


@st.composite
def messages_body(draw) -> dict:
    body = {"model": "qwasi-demo", "max_tokens": draw(SMALL),
            "messages": [{"role": "user", "content": draw(st.one_of(
                TEXT, st.just([{"type": "text", "text": "hi"}])))}]}
    optional = {"stream": st.booleans(), "system": TEXT, "temperature": st.floats(0, 1),
                "stop_sequences": st.lists(TEXT, max_size=2),
                "tools": st.just([{"name": "get_weather", "input_schema":
                                   TOOL["function"]["parameters"]}])}
    for k in draw(st.lists(st.sampled_from(sorted(optional)), max_size=2, unique=True)):
        body[k] = draw(optional[k])
    return body


def tokenize_body() -> st.SearchStrategy:
    return st.one_of(st.builds(lambda p: {"prompt": p}, TEXT),
                     st.just({"messages": [{"role": "user", "content": "hi"}]}))


def detokenize_body() -> st.SearchStrategy:
    return st.builds(lambda t: {"tokens": t}, st.lists(st.integers(0, 300), max_size=20))


# ------------------------------------------------------------- mutations
def key_of(obj: dict) -> st.SearchStrategy:
    """One of the object's keys, or a new one."""
    return st.one_of(st.sampled_from(sorted(obj)), STRINGS) if obj else STRINGS


@st.composite
def mutated(draw, valid: st.SearchStrategy) -> dict:
    """A valid body, then a few fields (top level or one level down) set to
    arbitrary JSON, dropped, or added; long generations are kept out of it (a
    mutated `max_tokens` stays small or is not a count at all)."""
    body = copy.deepcopy(draw(valid))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(key_of(body))
        action = draw(st.sampled_from(["set", "drop", "nested"]))
        if action == "drop":
            body.pop(key, None)
        elif action == "nested" and isinstance(body.get(key), list) and body[key] \
                and isinstance(body[key][0], dict):
            inner = dict(body[key][0])
            inner[draw(key_of(inner))] = draw(ODD_VALUES)
            body[key] = [inner, *body[key][1:]]
        else:
            body[key] = draw(ODD_VALUES)
    for k in ("max_tokens", "max_output_tokens", "max_completion_tokens", "n", "best_of"):
        if isinstance(body.get(k), (int, float)) and not isinstance(body[k], bool) and body[k] > 6:
            body[k] = 6
    # A request whose length cap was dropped or set to null generates to the
    # context length (the APIs' default): correct, but minutes long here.
    if all(body.get(k) is None for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")):
        body["max_output_tokens" if "input" in body else "max_completion_tokens"] = 4
    return body


RAW = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"", b"{", b"[]", b"null", b'"x"', b"{}", b'{"a":1}{"b":2}', b"\xff\xfe{}",
                     b'{"messages": [' * 2000, b"[" * 5000 + b"]" * 5000, b"1" * 10_000, b'{"model": "' + b"a" * 200_000 + b'"}']),
)


def body_bytes(v) -> bytes:
    return json.dumps(v, allow_nan=False).encode("utf-8", "surrogatepass")


# --------------------------------------------------------------- checks
def send(server, method: str, path: str, body: bytes | None,
         headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT)
    try:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type", ""), resp.read()
    except (socket.timeout, TimeoutError) as e:
        pytest.fail(f"{method} {path}: no complete response within {TIMEOUT} s ({e}); "
                    f"body {body[:300] if body else body!r}")
    finally:
        conn.close()


def check(server, method: str, path: str, body: bytes | None, headers=None) -> None:
    status, ctype, data = send(server, method, path, body, headers)
    shown = (body or b"")[:500]
    assert 200 <= status < 500, (
        f"{method} {path} -> {status}: {data[:1000]!r}\nrequest body: {shown!r}"
        f"\nserver log:\n{server.log_tail(20)}"
    )
    if status >= 400:
        err = json.loads(data)
        assert isinstance(err.get("error"), dict) and err["error"].get("message"), data[:500]
    elif ctype.startswith("application/json"):
        json.loads(data)
    elif ctype.startswith("text/event-stream"):
        text = data.decode("utf-8")
        if path.startswith("/v1/messages"):
            assert "event: message_stop" in text, f"stream not ended: {text[-500:]!r}"
        elif path == "/v1/responses":
            assert "response.completed" in text or "response.incomplete" in text, text[-500:]
        else:
            assert text.rstrip().endswith("data: [DONE]"), f"stream not ended: {text[-500:]!r}"


ROUTES = {
    "/v1/chat/completions": chat_body(),
    "/v1/completions": completion_body(),
    "/v1/responses": responses_body(),
    "/v1/messages": messages_body(),
    "/v1/messages/count_tokens": messages_body(),
    "/tokenize": tokenize_body(),
    "/detokenize": detokenize_body(),
}


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", sorted(ROUTES))
def test_generated_requests_get_2xx_or_4xx(server, path):
    valid = ROUTES[path]

    @SETTINGS
    @given(st.one_of(valid, mutated(valid), mutated(valid)))
    def run(body):
        check(server, "POST", path, body_bytes(body))

    run()


@pytest.mark.timeout(900)
@SETTINGS
@given(
    path=st.sampled_from([*sorted(ROUTES), "/v1/models", "/v1/models/x%00y", "/v1/embeddings",
                          "/v1/responses/resp_1", "/", "//v1/chat/completions", "/v1/chat/completions?x=%zz"]),
    method=st.sampled_from(["POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS"]),
    body=RAW,
    ctype=st.sampled_from(["application/json", "text/plain", "", "application/json; charset=latin1"]),
)
def test_raw_bodies_methods_and_paths(server, path, method, body, ctype):
    check(server, method, path, body, {"Content-Type": ctype})
