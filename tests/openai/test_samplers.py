"""llama-server's sampler fields (typical_p, XTC, DRY, Mirostat, top-nσ,
dynamic temperature, repeat_penalty/repeat_last_n) and GBNF grammars on the real model through
the official SDK: each accepted on both endpoints and reproducible under a
seed, a bad value a 400 naming its field, and DRY visibly breaking a
greedy loop. GBNF grammars are tested beside Lark ones in test_structured.py."""

from __future__ import annotations

import openai
import pytest

HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]

SAMPLERS = {
    "typical": {"typical_p": 0.8},
    "xtc": {"xtc_probability": 0.5, "xtc_threshold": 0.1},
    "dry": {"dry_multiplier": 0.8, "dry_sequence_breakers": ["\n"]},
    "mirostat1": {"mirostat": 1, "mirostat_tau": 4.0},
    "mirostat2": {"mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2},
    "repeat": {"repeat_penalty": 1.2, "repeat_last_n": -1},
    "top_n_sigma": {"top_n_sigma": 1.0},
    "dynatemp": {"dynatemp_range": 0.5, "dynatemp_exponent": 1.5},
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_each_sampler_answers_and_a_seed_reproduces_it(client, model_id, name):
    def chat():
        return client.chat.completions.create(
            model=model_id, messages=HELLO, max_tokens=12, temperature=1.0, seed=5,
            extra_body=SAMPLERS[name],
        ).choices[0].message.content

    first = chat()
    assert first, name
    assert chat() == first, name
    done = client.completions.create(
        model=model_id, prompt="The sea is", max_tokens=8, seed=5, extra_body=SAMPLERS[name]
    )
    assert done.choices[0].text


@pytest.mark.parametrize(
    "body, param",
    [
        ({"typical_p": 1.5}, "typical_p"),
        ({"xtc_threshold": -0.1}, "xtc_threshold"),
        ({"dry_base": 0.5}, "dry_base"),
        ({"dry_sequence_breakers": []}, "dry_sequence_breakers"),
        ({"mirostat": 3}, "mirostat"),
        ({"mirostat_eta": -1}, "mirostat_eta"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"dynatemp_range": -1}, "dynatemp_range"),
        ({"top_n_sigma": "wide"}, "top_n_sigma"),
        ({"grammar": "root ::= <|im_end|>"}, "grammar"),
    ],
)
def test_a_bad_sampler_value_is_a_400_naming_it(client, model_id, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=HELLO, max_tokens=4, extra_body=body)
    assert e.value.body["param"] == param


def longest_run(words: list[str]) -> int:
    best = run = 0
    for i, w in enumerate(words):
        run = run + 1 if i and w == words[i - 1] else 1
        best = max(best, run)
    return best


def test_dry_breaks_a_greedy_loop(client, model_id):
    prompt = "red green blue red green blue red green blue red green blue red green blue"

    def words(extra):
        text = client.completions.create(
            model=model_id, prompt=prompt, max_tokens=16, temperature=0, extra_body=extra
        ).choices[0].text
        return text.split()

    plain = words({})
    dry = words({"dry_multiplier": 2.0, "dry_penalty_last_n": -1})
    # Greedy, SmolLM2 falls into one word repeated to the token limit;
    # DRY penalises extending the repeat, so the loop breaks early.
    assert longest_run(plain) >= 12, plain
    assert longest_run(dry) <= 4 and len(set(dry)) > 1, dry


@pytest.mark.parametrize("name", ["dry", "mirostat2", "repeat"])
def test_responses_and_messages_take_the_samplers_as_chat_does(client, model_id, http, name):
    """The Responses and Anthropic Messages endpoints pass llama-server's
    sampler fields on to chat: the same seeded answer, and the same 400."""
    def responses(extra):
        return client.responses.create(model=model_id, input="Write one sentence about the sea.",
                                       max_output_tokens=12, temperature=1.0, extra_body={"seed": 5, **extra})

    def messages(extra):
        return http.post("/v1/messages", json={
            "model": model_id, "max_tokens": 12, "temperature": 1.0, "seed": 5,
            "messages": [{"role": "user", "content": "Write one sentence about the sea."}], **extra})

    first = responses(SAMPLERS[name]).output_text
    assert first and responses(SAMPLERS[name]).output_text == first
    r = messages(SAMPLERS[name])
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == messages(SAMPLERS[name]).json()["content"][0]["text"]
    bad = {"dry": {"dry_base": 0.5}, "mirostat2": {"mirostat": 3}, "repeat": {"repeat_last_n": -2}}[name]
    field = next(iter(bad))
    with pytest.raises(openai.BadRequestError) as e:
        responses(bad)
    assert e.value.body["param"] == field, e.value.body
    r = messages(bad)
    assert r.status_code == 400 and field in r.text, r.text


def test_a_tight_top_n_sigma_keeps_a_hot_sample_on_the_greedy_path(client, model_id):
    """Within 0.01 standard deviations of the top logit only the top token
    is left, so even at temperature 2 the answer is the greedy one, which
    the same temperature without the cut leaves."""
    def chat(temperature=2.0, **extra):
        return client.chat.completions.create(
            model=model_id, messages=HELLO, max_tokens=12, seed=3, extra_body=extra,
            temperature=temperature,
        ).choices[0].message.content

    greedy = chat(temperature=0.0)
    assert chat(top_n_sigma=0.01) == greedy
    assert chat() != greedy
