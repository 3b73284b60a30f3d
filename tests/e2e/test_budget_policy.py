"""The example token-budget policy (examples/token-budget-policy) in front of
the bundled OpenAI guest, over real HTTP: unknown and missing keys (401),
per-key request rates and token budgets (429 with Retry-After), through the
host-kept policy-state counters."""

from __future__ import annotations

import json
import time

import pytest

from conftest import Server, example_wasm

ALICE = "sk-budget-alice-0123456789"
BOB = "sk-budget-bob-9876543210"
COST = 8  # tokens-per-request, = --max-completion-tokens


@pytest.fixture(scope="module")
def budget_server():
    wasm = example_wasm("qwasi-token-budget-policy", "qwasi_token_budget_policy")
    settings = [
        f"key=alice:{ALICE}",
        f"key=bob:{BOB}",
        "requests-per-minute=100",
        "requests-per-minute.bob=3",
        f"token-budget={3 * COST}",
        "token-budget.bob=0",
        f"tokens-per-request={COST}",
        "token-window=1h",
    ]
    args = ["--policy", str(wasm), "--max-completion-tokens", str(COST)]
    for s in settings:
        args += ["--policy-setting", s]
    s = Server(args, "budget").start()
    status, _, data = s.request("GET", "/v1/models", headers=auth(ALICE))
    assert status == 200, data
    s.model = json.loads(data)["data"][0]["id"]
    yield s
    s.stop()


def clear_of_window_end(window: int, margin: float = 3.0) -> None:
    """The counters' windows are aligned to the clock: don't straddle an end."""
    left = window - time.time() % window
    if left < margin:
        time.sleep(left + 0.5)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(server: Server, key: str):
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": COST, "chat_template_kwargs": {"enable_thinking": False}}
    status, headers, data = server.request("POST", "/v1/chat/completions", body, auth(key))
    return status, headers, json.loads(data)


def test_missing_and_unknown_keys_get_401(budget_server):
    status, _, data = budget_server.request("GET", "/v1/models")
    assert status == 401, data
    err = json.loads(data)["error"]
    assert err["code"] == "invalid_api_key"
    assert "Missing API key" in err["message"]
    status, _, data = budget_server.request("GET", "/v1/models", headers=auth("sk-nope"))
    assert status == 401
    assert "Incorrect API key" in json.loads(data)["error"]["message"]
    # The host answers /health itself.
    status, _, _ = budget_server.request("GET", "/health")
    assert status == 200


def test_token_budget_is_exhausted(budget_server):
    clear_of_window_end(3600)
    for i in range(3):
        status, _, body = chat(budget_server, ALICE)
        assert status == 200, (i, body)
        assert body["usage"]["completion_tokens"] <= COST
    # Listing models costs no tokens.
    status, _, _ = budget_server.request("GET", "/v1/models", headers=auth(ALICE))
    assert status == 200
    status, headers, body = chat(budget_server, ALICE)
    assert status == 429, body
    assert body["error"]["code"] == "token_budget_exceeded"
    assert f"{3 * COST} of {3 * COST} tokens per 3600 s" in body["error"]["message"]
    retry = int(headers["Retry-After"])
    assert 0 < retry <= 3600
    # Still exhausted on the next try.
    status, _, _ = chat(budget_server, ALICE)
    assert status == 429


def test_request_rate_per_key(budget_server):
    clear_of_window_end(60)
    for _ in range(3):
        status, _, data = budget_server.request("GET", "/v1/models", headers=auth(BOB))
        assert status == 200, data
    status, headers, data = budget_server.request("GET", "/v1/models", headers=auth(BOB))
    assert status == 429, data
    err = json.loads(data)["error"]
    assert err["code"] == "rate_limit_exceeded"
    assert "3 requests per minute" in err["message"]
    assert 0 < int(headers["Retry-After"]) <= 60
    # bob has no token budget (token-budget.bob=0) but is rate limited; alice's
    # rate is her own.
    status, _, _ = budget_server.request("GET", "/v1/models", headers=auth(ALICE))
    assert status == 200
