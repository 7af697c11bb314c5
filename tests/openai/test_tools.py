"""Tool calling on the real model through the official SDK: a forced call
(`required`, a named function) whose arguments validate against the
function's schema, streamed and not; a whole tool loop (call -> `role: tool`
result -> answer); and bad tool input as a 400 naming the field."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel, Field


class GetWeather(BaseModel):
    """Current weather of a city."""

    city: str = Field(max_length=40)
    unit: str = Field(pattern="^(celsius|fahrenheit)$")


class AddNumbers(BaseModel):
    """Adds two integers."""

    a: int
    b: int


TOOLS = [openai.pydantic_function_tool(GetWeather), openai.pydantic_function_tool(AddNumbers)]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def test_a_named_function_is_called_with_valid_arguments(client, model_id):
    for seed in range(3):
        resp = client.chat.completions.create(
            model=model_id, messages=ASK, tools=TOOLS, tool_choice=named("GetWeather"),
            temperature=1.0, seed=seed, max_tokens=120, parallel_tool_calls=False,
        )
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "GetWeather"
        GetWeather.model_validate_json(call.function.arguments)


def test_required_calls_one_of_the_tools(client, model_id):
    resp = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Add 2 and 3."}], tools=TOOLS,
        tool_choice="required", temperature=1.0, seed=5, max_tokens=160, parallel_tool_calls=True,
    )
    calls = resp.choices[0].message.tool_calls
    # Parallel calls may go on until max_tokens; then the reason stays `length`.
    assert resp.choices[0].finish_reason in ("tool_calls", "length") and calls
    for c in calls:
        model = {"GetWeather": GetWeather, "AddNumbers": AddNumbers}[c.function.name]
        model.model_validate_json(c.function.arguments)


def test_a_streamed_call_is_assembled_by_the_sdk(client, model_id):
    with client.chat.completions.stream(
        model=model_id, messages=ASK, tools=TOOLS, tool_choice=named("GetWeather"),
        temperature=1.0, seed=2, max_tokens=120, parallel_tool_calls=False,
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "GetWeather"
    parsed = call.function.parsed_arguments
    assert isinstance(parsed, GetWeather)
    # The raw stream too: the call's id and name in its first delta, then
    # its arguments in fragments as they are generated, then the finish.
    chunks = list(client.chat.completions.create(
        model=model_id, messages=ASK, tools=TOOLS, tool_choice=named("GetWeather"),
        temperature=1.0, seed=2, max_tokens=120, stream=True, parallel_tool_calls=False,
    ))
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    first, rest = deltas[0], deltas[1:]
    assert first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "GetWeather" and first.function.arguments == ""
    assert len(rest) >= 3, deltas
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    GetWeather.model_validate_json("".join(d.function.arguments for d in rest))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_forced_call_ends_when_its_calls_end(client, model_id):
    # SmolLM2 under `required` used to write the same call again and again
    # until max_tokens about half the time; a repeated call now ends the
    # answer (and is not returned twice).
    for seed in range(4):
        resp = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Add 2 and 3."}], tools=TOOLS,
            tool_choice="required", temperature=1.0, seed=seed, max_tokens=160,
        )
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice)
        assert resp.usage.completion_tokens < 160
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
        assert calls and all(calls[i] not in calls[:i] for i in range(len(calls))), calls


def test_a_whole_tool_loop_ends_in_an_answer(client, model_id):
    first = client.chat.completions.create(
        model=model_id, messages=ASK, tools=TOOLS, tool_choice=named("GetWeather"),
        temperature=0, max_tokens=120, parallel_tool_calls=False,
    )
    msg = first.choices[0].message
    (call,) = msg.tool_calls
    messages = ASK + [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    final = client.chat.completions.create(
        model=model_id, messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=60,
    )
    choice = final.choices[0]
    assert choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.content and choice.message.content.strip()


@pytest.mark.parametrize(
    "tools, tool_choice, param",
    [
        ([{"type": "function", "function": {"parameters": {}}}], None, "tools[0].function.name"),
        ([{"type": "retrieval"}], None, "tools[0].type"),
        (TOOLS, {"type": "function", "function": {"name": "launch_rockets"}}, "tool_choice"),
        (TOOLS, "sometimes", "tool_choice"),
    ],
)
def test_bad_tool_input_is_a_400_naming_the_field(client, model_id, tools, tool_choice, param):
    kw = {} if tool_choice is None else {"tool_choice": tool_choice}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=ASK, tools=tools, max_tokens=5, **kw)
    assert e.value.body["param"] == param
    ok = client.chat.completions.create(model=model_id, messages=ASK, max_tokens=3)
    assert ok.choices[0].message.content is not None


def test_a_tool_message_without_its_call_id_is_a_400(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_id, messages=ASK + [{"role": "tool", "content": "18 C"}], max_tokens=5,
        )
    assert e.value.body["param"] == "messages[1].tool_call_id"
