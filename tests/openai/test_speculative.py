"""Speculative decoding through the official SDK on the real model: prompt
lookup (`ngram`) and a draft model (`--draft-model`, here SmolLM2 drafting
for itself, so most drafts are accepted) give plain decoding's text token
for token, greedy and under a seed, with what was drafted and accepted in
the `tern` object; a mode the server cannot run is a 400 naming the field."""

from __future__ import annotations

import openai
import pytest

from conftest import API_KEY, MODEL, running_server

# A code edit: the answer repeats most of the prompt, so prompt lookup drafts.
EDIT = [{"role": "user", "content": (
    "Rewrite this function so it returns the total instead of printing it, and change nothing else:\n\n"
    "def add_all(values):\n    total = 0\n    for v in values:\n        total = total + v\n"
    "    print(total)\n")}]


@pytest.fixture(scope="module")
def drafting():
    with running_server(MODEL, "smollm2-135m-instruct", ("--draft-model", str(MODEL))) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)
        yield c, c.models.list().data[0].id
        c.close()


def answer(client, model, mode, **kw):
    resp = client.chat.completions.create(model=model, messages=EDIT, max_tokens=48,
                                          extra_body={"speculative": mode}, **kw)
    return resp.choices[0].message.content, resp.model_extra["tern"].get("speculative")


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 11}])
def test_ngram_and_draft_model_answers_are_plain_decodings(drafting, sampling):
    client, model = drafting
    plain, off = answer(client, model, "off", **sampling)
    assert plain
    for mode in ("ngram", "draft"):
        text, spec = answer(client, model, mode, **sampling)
        assert text == plain, (mode, text, plain)
        assert spec is not None and spec["verify_steps"] >= 1, (mode, spec)
        assert 0 < spec["accepted"] <= spec["drafted"], (mode, spec)
    if sampling["temperature"] == 0:
        # The draft model is the served one: its greedy drafts are mostly the
        # target's own choices (not all: it reads the prompt in other chunks
        # and stores its cache otherwise, so near-ties may round apart).
        _, spec = answer(client, model, "draft", **sampling)
        assert 2 * spec["accepted"] >= spec["drafted"], spec


def test_a_mode_the_server_cannot_run_is_a_400(client, model_id):
    # The shared server has no draft model.
    for mode in ("draft", {"type": "draft", "max_draft": 4}, "lookahead"):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model_id, messages=EDIT, max_tokens=4,
                                           extra_body={"speculative": mode})
        assert e.value.body["param"] == "speculative", (mode, e.value.body)
