"""The Responses API (`POST /v1/responses`, stateless) end to end: the
official `openai` client's `responses.create` against a real `qwasi serve`:
plain and streamed on the demo model, a function-call round trip on
scripted model turns (`--scripted-turns`)."""

from __future__ import annotations

import json

import openai
import pytest

from test_tools import scripted

NO_THINKING = {"effort": "none"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}


def test_plain(client, model_id):
    r = client.responses.create(model=model_id, input="Name three colours.",
                                instructions="Answer briefly.", max_output_tokens=8,
                                temperature=0, reasoning=NO_THINKING)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert [i.type for i in r.output] == ["message"]
    assert r.output_text == r.output[0].content[0].text
    assert 1 <= r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.store is False


def test_streamed(client, model_id):
    events = list(client.responses.create(model=model_id, input="Name three colours.",
                                          max_output_tokens=10, temperature=0,
                                          reasoning=NO_THINKING, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text
    assert final.usage.output_tokens >= 1


def test_stateless_is_a_clear_400(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_id, input="hi", previous_response_id="resp_x")
    assert e.value.param == "previous_response_id"
    assert "does not store" in e.value.message


THINK = "The user wants the weather.\n"
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>")


def test_function_call_round_trip():
    turns = [THINK + "</think>\n\n" + CALL, CALL, "It is sunny in Paris."]
    with scripted(turns) as s:
        client = s.client()
        model = client.models.list().data[0].id
        # Turn 1 (thinking on, the model's default): reasoning, then the call.
        r = client.responses.create(model=model, input="Weather in Paris?", tools=[WEATHER])
        assert [i.type for i in r.output] == ["reasoning", "function_call"]
        assert r.output[0].content[0].text == THINK
        call = r.output[1]
        assert call.name == "get_weather" and call.call_id.startswith("call_")
        assert json.loads(call.arguments) == {"city": "Paris"}
        assert r.usage.output_tokens_details.reasoning_tokens > 0

        # Turn 2, streamed: the call's arguments as events.
        events = list(client.responses.create(model=model, input="Weather in Paris?",
                                              tools=[WEATHER], reasoning=NO_THINKING,
                                              tool_choice="required", stream=True))
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert [i.type for i in added] == ["function_call"]
        deltas = "".join(e.delta for e in events
                         if e.type == "response.function_call_arguments.delta")
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert done.arguments == deltas and json.loads(deltas) == {"city": "Paris"}

        # Turn 3: the output items and the call's output go back as input.
        items = [{"role": "user", "content": "Weather in Paris?"}]
        items += [i.model_dump(exclude_none=True) for i in r.output]
        items.append({"type": "function_call_output", "call_id": call.call_id,
                      "output": '{"sky": "sunny"}'})
        final = client.responses.create(model=model, input=items, tools=[WEATHER],
                                        reasoning=NO_THINKING)
        assert final.output_text == "It is sunny in Paris."
        assert final.status == "completed"
