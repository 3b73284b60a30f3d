"""Structured outputs and enforced tool calls against `qwasi serve` on the
demo model, whose random weights never write valid JSON on their own: every
answer here is valid only because the engine constrains the decoding.
Clients: the official `openai` SDK (`chat.completions.parse` with pydantic
models) and LangChain (`with_structured_output`). Schemas bound their
strings, so a random model's output fits the token budget."""

from __future__ import annotations

import json
from typing import Literal, Optional

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


class Pet(BaseModel):
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    pets: list[Pet] = Field(max_length=2)
    nickname: Optional[str] = Field(default=None, max_length=5)


def test_openai_parse_with_pydantic(client, model_id):
    for seed in range(3):
        r = client.chat.completions.parse(
            model=model_id,
            messages=ASK,
            response_format=Person,
            max_tokens=200,
            seed=seed,
            extra_body=NO_THINK,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        person = choice.message.parsed
        assert isinstance(person, Person), choice.message
        jsonschema.validate(json.loads(choice.message.content), Person.model_json_schema())


def test_langchain_with_structured_output(server, model_id):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=model_id,
        base_url=f"{server.url}/v1",
        api_key="unused",
        max_tokens=200,
        max_retries=0,
        extra_body=NO_THINK,
    )
    person = llm.with_structured_output(Person, method="json_schema").invoke(
        "Describe a person."
    )
    assert isinstance(person, Person)


SCHEMAS = [
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
     "required": ["color"], "additionalProperties": False},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                      {"type": "null"}]},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                               "maxItems": 3}},
     "required": ["v", "tags"], "additionalProperties": False},
    {"type": "array", "items": {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.5}, "minItems": 1, "maxItems": 3},
]


def test_guided_json_and_response_format_raw(server, model_id):
    for i, schema in enumerate(SCHEMAS):
        for field in ("guided_json", "response_format"):
            body = {"model": model_id, "messages": ASK, "max_tokens": 200, "seed": i, **NO_THINK}
            if field == "guided_json":
                body["guided_json"] = schema
            else:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "s", "schema": schema, "strict": True}}
            status, _, raw = server.request("POST", "/v1/chat/completions", body)
            assert status == 200, raw
            v = json.loads(raw)
            assert v["choices"][0]["finish_reason"] == "stop", v
            jsonschema.validate(json.loads(v["choices"][0]["message"]["content"]), schema)


def test_regex_choice_and_grammar_on_completions(client, model_id):
    r = client.completions.create(model=model_id, prompt="A date:", max_tokens=20,
                                  extra_body={"guided_regex": r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"})
    text = r.choices[0].text
    assert len(text) == 10 and text[:2] == "20" and text[4] == "-" and text[7] == "-", text
    r = client.completions.create(model=model_id, prompt="Yes or no?", max_tokens=10,
                                  extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].text in ("yes", "no")
    r = client.completions.create(model=model_id, prompt="Sum:", max_tokens=20,
                                  extra_body={"structured_outputs": {
                                      "grammar": 'start: NUM ("+" NUM){1,3}\nNUM: /[1-9]/'}})
    parts = r.choices[0].text.split("+")
    assert 2 <= len(parts) <= 4 and all(p in "123456789" and len(p) == 1 for p in parts), r.choices[0].text


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_choice_is_enforced(client, model_id, choice):
    for seed in range(4):
        r = client.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER, CLOCK],
            tool_choice=choice,
            max_tokens=120,
            seed=seed,
            extra_body=NO_THINK,
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        calls = c.message.tool_calls
        assert calls, c.message
        for call in calls:
            if isinstance(choice, dict):
                assert call.function.name == "get_weather"
            tool = WEATHER if call.function.name == "get_weather" else CLOCK
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


TICKET = {
    "type": "function",
    "function": {
        "name": "open_ticket",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                "ref": {"type": "string", "pattern": "#[0-9]+", "maxLength": 8},
                "id": {"type": "string", "format": "uuid"},
                "ip": {"type": "string", "format": "ipv4"},
            },
            "required": ["code", "ref", "id", "ip"],
        },
    },
}


def test_raw_text_parameters_keep_pattern_and_format(client, model_id):
    """String parameters are raw text in the Qwen3.6 call syntax: their
    `pattern` and `format` hold on it (a strict tool, and a plain one)."""
    checker = jsonschema.FormatChecker(["uuid", "ipv4"])
    for strict in (False, True):
        tool = {**TICKET, "function": {**TICKET["function"], "strict": strict}}
        for seed in range(3):
            r = client.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "Open a ticket."}],
                tools=[tool], tool_choice="required", max_tokens=200, seed=seed,
                extra_body=NO_THINK)
            c = r.choices[0]
            assert c.finish_reason == "tool_calls", c
            args = json.loads(c.message.tool_calls[0].function.arguments)
            jsonschema.validate(args, TICKET["function"]["parameters"], format_checker=checker)
    # What cannot be enforced on raw text: a 400 for a strict tool.
    bad = {"type": "function", "function": {"name": "link", "strict": True, "parameters": {
        "type": "object", "properties": {"url": {"type": "string", "format": "uri"}},
        "required": ["url"]}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=ASK, tools=[bad],
                                       tool_choice="required", max_tokens=8, extra_body=NO_THINK)
    assert e.value.body["param"] == "tools", e.value.body
    assert "'format'" in e.value.body["message"] and "'url'" in e.value.body["message"], e.value.body


def test_bad_constraints_are_400s_naming_the_field(client, model_id):
    cases = [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "strict": True,
                                              "schema": {"type": "object", "properties": {"a": {"type": "strnig"}}}}}},
         "response_format.json_schema.schema"),
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model_id, messages=ASK, max_tokens=8,
                                           extra_body={**NO_THINK, **extra})
        assert e.value.body["param"] == param, (extra, e.value.body)
