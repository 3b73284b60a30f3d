"""Several choices per request through the official client: `n` in chat and
completions (streamed too), `best_of`, and a list of prompts."""

from __future__ import annotations

from helpers import EXACT, MESSAGES, PROMPT, token_count


def test_chat_n_choices(server, client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=4, n=3, seed=11, extra_body=EXACT
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in r.choices)
    assert all(isinstance(c.message.content, str) for c in r.choices)
    # Every choice is a generation of its own: 4 tokens each, the prompt counted once.
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens == token_count(server, {"messages": MESSAGES, **EXACT})
    # Choice k samples with seed + k: choice 1 of seed 11 is choice 0 of seed 12.
    again = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=4, n=1, seed=12, extra_body=EXACT
    )
    assert again.choices[0].message.content == r.choices[1].message.content


def test_chat_n_choices_stream(client, model_id):
    stream = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=3, n=2, seed=5, stream=True,
        stream_options={"include_usage": True}, extra_body=EXACT,
    )
    text = {0: "", 1: ""}
    finish = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == {0: "length", 1: "length"}
    assert usage.completion_tokens == 6
    whole = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=3, n=2, seed=5, extra_body=EXACT
    )
    assert [c.message.content for c in whole.choices] == [text[0], text[1]]


def test_completions_n_best_of_and_prompt_list(client, model_id):
    r = client.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=3, n=2, best_of=3, seed=1, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == 9  # all three candidates generated
    r = client.completions.create(
        model=model_id, prompt=[PROMPT, "Hello"], max_tokens=2, n=2, seed=1, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.usage.completion_tokens == 8
    # Choices 2 and 3 continue the second prompt: the same as asking for it alone.
    alone = client.completions.create(
        model=model_id, prompt="Hello", max_tokens=2, n=2, seed=1, extra_body={"ignore_eos": True}
    )
    assert [c.text for c in r.choices[2:]] == [c.text for c in alone.choices]
