"""The example Ollama-compatible guest (examples/ollama) served by the real
host on the demo model, driven with httpx: NDJSON streaming, one-object
responses, /api/chat, /api/tags, /api/show, /api/version, errors; and with
the official `ollama` Python client: structured outputs (`format`)."""

from __future__ import annotations

import json

import httpx
import ollama as ollama_client
import pytest
from pydantic import BaseModel, Field

from conftest import Server, example_wasm

NS_FIELDS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture(scope="module")
def ollama():
    wasm = example_wasm("qwasi-ollama-guest", "qwasi_ollama_guest")
    s = Server(["--guest", str(wasm)], "ollama").start()
    with httpx.Client(base_url=s.url, timeout=120) as c:
        yield c
    s.stop()


@pytest.fixture(scope="module")
def model(ollama) -> str:
    r = ollama.get("/api/tags")
    assert r.status_code == 200, r.text
    models = r.json()["models"]
    assert len(models) == 1, models
    m = models[0]
    assert m["name"] == m["model"]
    assert m["modified_at"].endswith("Z")
    assert m["details"]["family"] == "qwen3"
    return m["name"]


def ndjson(response: httpx.Response) -> list[dict]:
    """Reads a streamed NDJSON body line by line as it arrives."""
    assert response.headers["content-type"] == "application/x-ndjson"
    lines = []
    for line in response.iter_lines():
        assert line, "blank line in an NDJSON stream"
        lines.append(json.loads(line))
    return lines


def check_final(last: dict, model: str, eval_count: int, reason: str) -> None:
    assert last["done"] is True
    assert last["model"] == model
    assert last["done_reason"] == reason, last
    assert last["eval_count"] == eval_count
    assert last["prompt_eval_count"] > 0
    for k in NS_FIELDS:
        assert isinstance(last[k], int) and last[k] >= 0, (k, last)
    assert last["total_duration"] >= last["eval_duration"] > 0
    assert last["total_duration"] >= last["load_duration"] + last["prompt_eval_duration"]


def test_generate_streams_ndjson(ollama, model):
    body = {"model": model, "prompt": "Why is the sky blue?",
            "options": {"temperature": 0, "num_predict": 6}}
    with ollama.stream("POST", "/api/generate", json=body) as r:
        assert r.status_code == 200
        lines = ndjson(r)
    *deltas, last = lines
    assert deltas, lines
    for d in deltas:
        assert d["done"] is False
        assert d["model"] == model
        assert isinstance(d["response"], str) and d["response"]
        assert d["created_at"].endswith("Z")
    check_final(last, model, 6, "length")
    assert last["response"] == ""
    # `context`: the prompt's ids and the generated ones.
    assert len(last["context"]) == last["prompt_eval_count"] + 6
    streamed = "".join(d["response"] for d in deltas)

    # The same request without streaming: one object, the same greedy text.
    r = ollama.post("/api/generate", json={**body, "stream": False})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    one = r.json()
    check_final(one, model, 6, "length")
    assert one["response"] == streamed
    assert one["context"] == last["context"]

    # `context` continues the conversation: its ids are prepended.
    r = ollama.post("/api/generate", json={"model": model, "prompt": "More", "stream": False,
                                          "context": one["context"],
                                          "options": {"temperature": 0, "num_predict": 2}})
    assert r.status_code == 200
    cont = r.json()
    assert cont["prompt_eval_count"] > len(one["context"])
    assert cont["context"][: len(one["context"])] == one["context"]


def test_generate_seed_and_raw(ollama, model):
    body = {"model": model, "prompt": "Once upon a time", "raw": True, "stream": False,
            "options": {"temperature": 0.9, "top_k": 50, "seed": 42, "num_predict": 5}}
    a = ollama.post("/api/generate", json=body).json()
    b = ollama.post("/api/generate", json=body).json()
    assert a["response"] == b["response"]
    check_final(a, model, 5, "length")
    # raw: the prompt is not wrapped in the chat format, so it is shorter
    # than the same prompt through the template.
    templated = ollama.post("/api/generate", json={**body, "raw": False}).json()
    assert a["prompt_eval_count"] < templated["prompt_eval_count"]


def test_chat_streams_and_not(ollama, model):
    body = {"model": model, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three prime numbers."},
    ], "options": {"temperature": 0, "num_predict": 5}}
    with ollama.stream("POST", "/api/chat", json=body) as r:
        assert r.status_code == 200
        lines = ndjson(r)
    *deltas, last = lines
    for d in deltas:
        assert d["done"] is False
        assert d["message"]["role"] == "assistant"
        assert isinstance(d["message"]["content"], str)
    check_final(last, model, 5, "length")
    assert last["message"] == {"role": "assistant", "content": ""}
    assert "context" not in last

    r = ollama.post("/api/chat", json={**body, "stream": False})
    assert r.status_code == 200
    one = r.json()
    check_final(one, model, 5, "length")
    assert one["message"]["content"] == "".join(d["message"]["content"] for d in deltas)
    assert one["prompt_eval_count"] == last["prompt_eval_count"]

    # The prompt is exactly the Qwen3.6 chat format (thinking off): the same
    # text sent raw gives the same prompt length and the same greedy output.
    rendered = ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                "<|im_start|>user\nName three prime numbers.<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    raw = ollama.post("/api/generate", json={"model": model, "prompt": rendered, "raw": True,
                                            "stream": False,
                                            "options": {"temperature": 0, "num_predict": 5}}).json()
    assert raw["prompt_eval_count"] == one["prompt_eval_count"]
    assert raw["response"] == one["message"]["content"]


def test_chat_thinking(ollama, model):
    body = {"model": model, "think": True, "stream": False,
            "messages": [{"role": "user", "content": "hi"}],
            "options": {"temperature": 0, "num_predict": 4}}
    r = ollama.post("/api/chat", json=body)
    assert r.status_code == 200
    one = r.json()
    check_final(one, model, 4, "length")
    # The demo model never closes </think> in 4 tokens: it is all thinking.
    assert one["message"]["content"] == ""
    assert one["message"]["thinking"]


def test_stop_string(ollama, model):
    base = {"model": model, "prompt": "Count", "stream": False,
            "options": {"temperature": 0, "num_predict": 8}}
    full = ollama.post("/api/generate", json=base).json()["response"]
    # Cut at the start of the third token's text (a string the output contains).
    cut = next(i for i in range(1, len(full)) if full[i:].strip())
    stop = full[cut:cut + 2]
    r = ollama.post("/api/generate", json={**base, "options": {**base["options"], "stop": [stop]}})
    out = r.json()
    assert out["done_reason"] == "stop"
    assert out["response"] == full[: full.index(stop)]


def test_show_and_version(ollama, model):
    r = ollama.post("/api/show", json={"model": model})
    assert r.status_code == 200
    show = r.json()
    assert show["model_info"]["qwen3.context_length"] > 0
    assert "completion" in show["capabilities"]
    assert ollama.post("/api/show", json={"name": f"{model}:latest"}).status_code == 200
    v = ollama.get("/api/version")
    assert v.status_code == 200 and v.json()["version"]
    assert ollama.get("/").text == "Ollama is running"


@pytest.mark.parametrize("method,path,body,status,needle", [
    ("POST", "/api/generate", b"{not json", 400, "parse the JSON"),
    ("POST", "/api/chat", b"", 400, "empty"),
    ("POST", "/api/generate", {"prompt": "x"}, 400, "model is required"),
    ("POST", "/api/generate", {"model": "no-such-model", "prompt": "x"}, 404,
     "model 'no-such-model' not found"),
    ("POST", "/api/chat", {"model": "MODEL", "messages": [{"role": "robot", "content": "x"}]},
     400, "unknown role"),
    ("POST", "/api/generate", {"model": "MODEL", "prompt": "x", "format": "yaml"}, 400,
     'invalid format: "yaml"; expected "json" or a valid JSON Schema object'),
    ("POST", "/api/chat", {"model": "MODEL", "messages": [{"role": "user", "content": "x"}],
                           "format": {"type": "object", "properties": {"a": {"type": "strnig"}}}},
     400, "invalid JSON schema in format: "),
    ("POST", "/api/generate", {"model": "MODEL", "prompt": "x", "options": {"num_predict": "ten"}},
     400, "invalid type"),
    ("GET", "/api/generate", None, 405, "not allowed"),
    ("GET", "/api/nope", None, 404, "not found"),
])
def test_errors_are_ollama_shaped(ollama, model, method, path, body, status, needle):
    kwargs = {}
    if isinstance(body, bytes):
        kwargs["content"] = body
        kwargs["headers"] = {"content-type": "application/json"}
    elif body is not None:
        body = json.loads(json.dumps(body).replace('"MODEL"', json.dumps(model)))
        kwargs["json"] = body
    r = ollama.request(method, path, **kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()
    assert list(err) == ["error"], err
    assert needle in err["error"], err


class Pet(BaseModel):
    kind: str = Field(max_length=6)
    age: int = Field(ge=0, le=30)


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    pets: list[Pet] = Field(max_length=2)


@pytest.fixture(scope="module")
def client(ollama) -> ollama_client.Client:
    return ollama_client.Client(host=str(ollama.base_url), timeout=120)


def test_client_format_schema_parsed_by_pydantic(client, model):
    """`format=Model.model_json_schema()`, the Ollama docs' structured
    outputs: the demo model's random output is valid only because the
    format constrains it."""
    schema = Person.model_json_schema()
    for seed in range(3):
        r = client.chat(model=model, messages=[{"role": "user", "content": "Describe a person."}],
                        format=schema, options={"seed": seed, "num_predict": 300})
        assert r.done_reason == "stop", r
        person = Person.model_validate_json(r.message.content)
        assert 0 <= person.age <= 120
    # Streaming: the deltas join into the same kind of document.
    parts = [c.message.content for c in client.chat(
        model=model, messages=[{"role": "user", "content": "Another."}], format=schema,
        options={"seed": 9, "num_predict": 300}, stream=True)]
    Person.model_validate_json("".join(parts))


def test_client_format_json(client, model):
    """`format="json"`: a JSON object. Nearly uniform sampling (a huge
    temperature) over what the constraint allows: the random model's strings
    never close, so an output either is cut by `num_predict` or ends as soon
    as the object does (`{}`); either way it starts as an object."""
    finished = []
    for seed in range(12):
        r = client.generate(model=model, prompt="A JSON object, please.", format="json",
                            options={"seed": seed, "num_predict": 40, "temperature": 50,
                                     "top_k": 0, "top_p": 1})
        assert r.response.lstrip().startswith("{"), r.response
        if r.done_reason == "stop":
            assert isinstance(json.loads(r.response), dict), r.response
            finished.append(seed)
        else:
            assert r.done_reason == "length" and r.eval_count == 40, r
    assert finished, "no output completed its object"
    r = client.chat(model=model, messages=[{"role": "user", "content": "JSON?"}], format="json",
                    options={"temperature": 0, "num_predict": 5})
    assert r.message.content.lstrip().startswith("{"), r.message.content


def test_client_invalid_schema_is_a_400(client, model):
    with pytest.raises(ollama_client.ResponseError) as e:
        client.chat(model=model, messages=[{"role": "user", "content": "x"}],
                    format={"type": "object", "properties": {"a": {"type": "strnig"}}})
    assert e.value.status_code == 400
    assert e.value.error.startswith("invalid JSON schema in format: "), e.value.error
