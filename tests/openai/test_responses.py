"""`/v1/responses` through the official SDK on the real model: plain,
streamed (the SDK assembles the events), a function tool (forced, streamed
and not) with its output sent back, chaining by `previous_response_id`,
`GET`/`DELETE`, and bad input named."""

from __future__ import annotations

import json

import openai
import pytest

TOOLS = [{
    "type": "function", "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False},
}]


def test_plain_and_chained(client, model_id):
    first = client.responses.create(
        model=model_id, input="What is the capital of France?", instructions="Answer briefly.",
        max_output_tokens=30, temperature=0,
    )
    assert first.object == "response" and first.id.startswith("resp_")
    assert first.status in ("completed", "incomplete")
    assert first.output_text.strip()
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    second = client.responses.create(
        model=model_id, input="And of Italy?", previous_response_id=first.id, max_output_tokens=30, temperature=0,
    )
    # The chained prompt holds the first turn: more input tokens than the question alone.
    alone = client.responses.create(model=model_id, input="And of Italy?", max_output_tokens=1, temperature=0)
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    got = client.responses.retrieve(second.id)
    assert got.output_text == second.output_text and got.previous_response_id == first.id


def test_streamed_events_assemble_into_the_response(client, model_id):
    with client.responses.stream(model=model_id, input="Say hello.", max_output_tokens=200, temperature=0) as s:
        events = [e for e in s]
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"  # (an answer cut by max_output_tokens ends in response.incomplete)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and deltas.strip()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    plain = client.responses.create(model=model_id, input="Say hello.", max_output_tokens=200, temperature=0)
    assert plain.output_text == final.output_text


def test_a_function_tool_round_trip(client, model_id):
    # Greedy and room to spare: a sampled city (up to 30 characters, escapes
    # allowed) once ran past 60 tokens, and a call cut by the limit is text.
    call_resp = client.responses.create(
        model=model_id, input="What's the weather in Rome?", tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=120, parallel_tool_calls=False,
        temperature=0,
    )
    (call,) = [o for o in call_resp.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert set(json.loads(call.arguments)) == {"city"}
    answer = client.responses.create(
        model=model_id, previous_response_id=call_resp.id, tools=TOOLS, max_output_tokens=40, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"}],
    )
    assert answer.output_text.strip()
    with client.responses.stream(
        model=model_id, input="What's the weather in Rome?", tools=TOOLS, tool_choice="required",
        max_output_tokens=120, parallel_tool_calls=False, temperature=0,
    ) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert [o.type for o in final.output] == ["function_call"]


def test_delete_then_chaining_is_a_404(client, model_id):
    r = client.responses.create(model=model_id, input="hi", max_output_tokens=3)
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=model_id, input="again", previous_response_id=r.id, max_output_tokens=3)
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    unstored = client.responses.create(model=model_id, input="hi", max_output_tokens=3, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize(
    "kw, param",
    [
        ({"input": []}, "input"),
        ({"input": [{"type": "computer_call"}]}, "input[0]"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(client, model_id, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_id, max_output_tokens=3, **kw)
    assert e.value.body["param"] == param
    assert client.responses.create(model=model_id, input="ok", max_output_tokens=2).output is not None
