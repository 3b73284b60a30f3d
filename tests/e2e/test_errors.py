"""(e) OpenAI error objects, as the official client sees them and on the wire."""

from __future__ import annotations

import json

import openai
import pytest
from helpers import MESSAGES, PROMPT


def test_bad_param_is_bad_request(client, model_id):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=model_id, messages=MESSAGES, temperature=5)
    e = ei.value
    assert e.status_code == 400
    assert e.type == "invalid_request_error"
    assert e.param == "temperature"
    assert e.code == "invalid_value"
    assert "temperature" in e.message


def test_bad_param_when_streaming_is_an_http_error(client, model_id):
    """Validation happens before the stream starts: a 400 status, not an SSE error."""
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=model_id, prompt=PROMPT, top_p=0, stream=True)
    assert ei.value.param == "top_p"


def test_missing_messages_is_bad_request(server, model_id):
    status, _, body = server.request("POST", "/v1/chat/completions", {"model": model_id})
    assert status == 400
    err = json.loads(body)["error"]
    assert err["type"] == "invalid_request_error"
    assert err["code"] == "missing_required_parameter"
    assert err["param"] == "messages"


def test_invalid_json_is_bad_request(server):
    status, _, body = server.request("POST", "/v1/completions", b"{not json")
    assert status == 400
    assert json.loads(body)["error"]["code"] == "invalid_json"


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert ei.value.status_code == 404
    assert ei.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT)


def test_models_retrieve(client, model_id):
    m = client.models.retrieve(model_id)
    assert m.id == model_id and m.object == "model"
    with pytest.raises(openai.NotFoundError) as ei:
        client.models.retrieve("no-such-model")
    assert ei.value.code == "model_not_found"


def test_unknown_path_and_wrong_method(server):
    status, _, body = server.request("GET", "/v1/no-such-endpoint")
    assert status == 404
    assert "error" in json.loads(body)
    status, headers, body = server.request("GET", "/v1/chat/completions")
    assert status == 405
    assert "POST" in headers.get("Allow", "")
    assert json.loads(body)["error"]["code"] == "method_not_allowed"


def test_context_length_exceeded(client, model_id):
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=model_id, prompt=PROMPT, max_tokens=10_000_000)
    assert ei.value.code in ("context_length_exceeded", "invalid_value")
