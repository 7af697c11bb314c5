"""Structured outputs on the real model through the official SDK:
`chat.completions.parse` with a Pydantic model (nested, enum, list) at
temperature 1, a raw `json_schema`, Tern's `grammar` extension (Lark, and GBNF
translated to it), and schemas
the engine cannot enforce refused by name (never answered unconstrained)."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated

import openai
import pytest
from pydantic import BaseModel, Field


class Mood(str, Enum):
    happy = "happy"
    sad = "sad"
    calm = "calm"


class Address(BaseModel):
    city: str = Field(max_length=30)
    country: str = Field(max_length=30)


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=150)
    mood: Mood
    # Bounded strings: a 135M model at temperature 1 may otherwise ramble
    # inside a string until max_tokens (the schema would allow it).
    likes: list[Annotated[str, Field(max_length=30)]] = Field(max_length=3)
    home: Address


PROMPT = "Describe Ann, 31, a calm person from Lyon, France, who likes cats and tea. Answer in JSON."


def test_parse_with_a_pydantic_model_holds_twenty_of_twenty(client, model_id):
    parsed = []
    for seed in (1, 2):
        resp = client.chat.completions.parse(
            model=model_id,
            messages=[{"role": "user", "content": PROMPT}],
            response_format=Person,
            temperature=1.0,
            n=10,
            seed=seed,
            max_tokens=200,
        )
        for choice in resp.choices:
            assert choice.finish_reason == "stop", choice.message.content
            assert isinstance(choice.message.parsed, Person), choice.message.content
            parsed.append(choice.message.parsed)
    assert len(parsed) == 20
    assert all(len(p.likes) <= 3 and 0 <= p.age <= 150 and len(p.home.city) <= 30 for p in parsed)


def test_a_raw_json_schema_is_enforced(client, model_id):
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "integer"}},
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    }
    resp = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Is the sky blue?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": True}},
        temperature=1.0,
        max_tokens=60,
        seed=3,
    )
    value = json.loads(resp.choices[0].message.content)
    assert value["answer"] in ("yes", "no")
    assert isinstance(value["confidence"], int)
    assert set(value) == {"answer", "confidence"}


@pytest.mark.parametrize(
    "grammar, answers",
    [
        ('start: "yes" | "no" | "maybe"', ("yes", "no", "maybe")),
        # GBNF (llama.cpp's format), translated to Lark by Tern.
        ('root ::= ("yes" | "no") # an answer', ("yes", "no")),
    ],
    ids=["lark", "gbnf"],
)
def test_a_grammar_extension_is_enforced(client, model_id, grammar, answers):
    for seed in range(3):
        resp = client.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "Is water wet? Say yes or no."}],
            temperature=1.0,
            max_tokens=10,
            seed=seed,
            extra_body={"grammar": grammar},
        )
        assert resp.choices[0].message.content in answers
        assert resp.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "response_format, param",
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}, "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}, "response_format.json_schema.name"),
        ({"type": "json_schema"}, "response_format.json_schema"),
    ],
)
def test_a_schema_that_cannot_be_enforced_is_a_400_naming_it(client, model_id, response_format, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "hi"}],
            response_format=response_format,
            max_tokens=5,
        )
    assert e.value.body["param"] == param
    # ... and the server serves the next request.
    ok = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert ok.choices[0].message.content is not None


def test_a_bad_grammar_is_a_400(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            extra_body={"grammar": "start: undefined_rule"},
        )
    assert e.value.body["param"] == "grammar"
    assert "undefined_rule" in e.value.body["message"]
