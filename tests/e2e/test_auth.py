"""(f) API keys: the bundled policy guest behind `qwasi serve --api-key`."""

from __future__ import annotations

import json

import openai
import pytest
from conftest import ALICE_KEY, BOB_KEY
from helpers import EXACT, MESSAGES


def test_wrong_key_is_rejected(auth_server):
    client = auth_server.client(api_key="sk-wrong-e2e-key-000000000")
    with pytest.raises(openai.AuthenticationError) as ei:
        client.models.list()
    e = ei.value
    assert e.status_code == 401
    assert e.code == "invalid_api_key"
    assert e.body["message"].startswith("Incorrect API key provided"), e.body
    assert e.type == "authentication_error"
    assert "sk-wrong-e2e-key-000000000" not in e.message  # masked
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="any", messages=MESSAGES)


def test_right_keys_are_accepted(auth_server):
    for key in (ALICE_KEY, BOB_KEY):
        client = auth_server.client(api_key=key)
        model_id = client.models.list().data[0].id
        r = client.chat.completions.create(
            model=model_id, messages=MESSAGES, max_tokens=3, temperature=0, extra_body=EXACT
        )
        assert r.usage.completion_tokens == 3
        chunks = list(
            client.chat.completions.create(
                model=model_id, messages=MESSAGES, max_tokens=3, temperature=0,
                extra_body=EXACT, stream=True,
            )
        )
        assert chunks[-1].choices[0].finish_reason == "length"


def test_missing_key_is_rejected(auth_server):
    status, headers, body = auth_server.request("GET", "/v1/models")
    assert status == 401
    err = json.loads(body)["error"]
    assert err["code"] == "invalid_api_key"
    assert err["type"] == "authentication_error"
    assert err["message"].startswith("Missing API key")
    # Also for a generation request with a streaming body.
    status, _, body = auth_server.request(
        "POST", "/v1/chat/completions", {"model": "x", "messages": MESSAGES, "stream": True}
    )
    assert status == 401
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


def test_wrong_scheme_and_x_api_key(auth_server):
    status, _, _ = auth_server.request(
        "GET", "/v1/models", headers={"Authorization": f"Basic {ALICE_KEY}"}
    )
    assert status == 401
    status, _, body = auth_server.request("GET", "/v1/models", headers={"x-api-key": BOB_KEY})
    assert status == 200, body
    status, _, body = auth_server.request(
        "GET", "/v1/models", headers={"authorization": f"bearer {ALICE_KEY}"}
    )
    assert status == 200, body
    # The `alice:` id is not part of the secret.
    status, _, _ = auth_server.request(
        "GET", "/v1/models", headers={"Authorization": f"Bearer alice:{ALICE_KEY}"}
    )
    assert status == 401


def test_health_and_ready_need_no_key(auth_server):
    for path in ("/health", "/ready"):
        status, _, body = auth_server.request("GET", path)
        assert status == 200, (path, body)
