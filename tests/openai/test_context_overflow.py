"""A conversation that outgrows the context: a 400 with the numbers by
default and under `context_overflow: "error"`, served to the end under
`"shift"` (the oldest tokens after the first few dropped, `tern` saying
which) and under a KV policy (read whole; whenever the context fills the
policy evicts and what it kept is re-numbered, `tern` saying how often and
how much). The model is a tiny random-weight Qwen3 (tiny_gguf.py) with a
128-token context, so a conversation four times that long is cheap."""

from __future__ import annotations

import openai
import pytest

from conftest import API_KEY, ROOT, running_server
from tiny_gguf import write_tiny_qwen3

CONTEXT = 128


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    model = write_tiny_qwen3(tmp_path_factory.mktemp("ctx") / "tiny-qwen3-ctx128.gguf", ROOT, context=CONTEXT)
    with running_server(model, "", ("--kv-memory", "64MiB")) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)
        yield c, c.models.list().data[0].id
        c.close()


def turn(i: int) -> dict:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": f"Note {i}: the river runs past mill number {i}."}


def tern(resp) -> dict:
    return resp.model_extra["tern"]


def test_an_overlong_conversation_is_a_400_unless_the_client_asks_for_shift(small):
    client, model = small
    long = [turn(i) for i in range(41)]  # some 4x the context
    for extra in ({}, {"context_overflow": "error"}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=long, max_tokens=8, extra_body=extra)
        assert e.value.body["code"] == "context_length_exceeded", e.value.body
    resp = client.chat.completions.create(model=model, messages=long, max_tokens=8, temperature=0,
                                          extra_body={"context_overflow": "shift"})
    shift = tern(resp)["context_overflow"]
    assert shift["prompt_tokens"] >= 4 * CONTEXT, shift
    # The first 4 tokens and the newest are kept; the answer has its room.
    assert shift["evicted_from"] == 4
    assert shift["evicted_to"] - shift["evicted_from"] == shift["evicted_tokens"]
    assert shift["kept_tokens"] == resp.usage.prompt_tokens == CONTEXT - 8
    assert shift["prompt_tokens"] - shift["evicted_tokens"] == shift["kept_tokens"]
    assert resp.usage.completion_tokens >= 1
    # Streamed, the last chunk's `tern` says the same.
    chunks = list(client.chat.completions.create(model=model, messages=long, max_tokens=8, temperature=0,
                                                 stream=True, extra_body={"context_overflow": "shift"}))
    last = [c for c in chunks if c.model_extra.get("tern")][-1]
    assert last.model_extra["tern"]["context_overflow"] == shift


POLICY = "snapkv:budget=48,window=8"


def test_under_a_kv_policy_a_conversation_four_contexts_long_is_read_whole(small):
    client, model = small
    long = [turn(i) for i in range(41)]
    ask = {"context_overflow": POLICY, "ignore_eos": True}
    resp = client.chat.completions.create(model=model, messages=long, max_tokens=40, temperature=0,
                                          extra_body=ask)
    info = tern(resp)["context_overflow"]
    assert info["policy"].startswith("snapkv:budget=48"), info
    # Every prompt token was read, and the answer ran past the context too.
    assert resp.usage.prompt_tokens == info["prompt_tokens"] >= 4 * CONTEXT
    assert resp.usage.completion_tokens == 40
    assert info["read_tokens"] == info["prompt_tokens"] + 40 - 1
    # Each time the context filled, snapkv kept its 48 and 80 positions were
    # freed: some 7 times for ~560 tokens.
    assert info["shifts"] >= (info["read_tokens"] - CONTEXT) // (CONTEXT - 48), info
    assert 48 <= info["kept_tokens"] <= CONTEXT
    assert info["evicted_tokens"] == info["read_tokens"] - info["kept_tokens"]
    # Streamed, the last chunk's `tern` says the same.
    chunks = list(client.chat.completions.create(model=model, messages=long, max_tokens=40, temperature=0,
                                                 stream=True, extra_body=ask))
    last = [c for c in chunks if c.model_extra.get("tern")][-1]
    assert last.model_extra["tern"]["context_overflow"] == info
    # A policy that cannot make room, or none at all, is a 400 naming the field.
    for bad in ("snapkv:budget=128,window=8", "full", "snapkv:budget=x"):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=long, max_tokens=8,
                                           extra_body={"context_overflow": bad})
        assert e.value.body["param"] == "context_overflow", (bad, e.value.body)


def test_a_conversation_grown_turn_by_turn_to_four_contexts_is_served_to_the_end(small):
    client, model = small
    messages = [{"role": "system", "content": "You keep notes."}]
    rendered, shifted_turns = 0, 0
    i = 0
    while rendered < 4 * CONTEXT:
        messages.append(turn(2 * i))
        resp = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                              extra_body={"context_overflow": "shift"})
        shift = tern(resp).get("context_overflow")
        rendered = shift["prompt_tokens"] if shift else resp.usage.prompt_tokens
        shifted_turns += shift is not None
        assert resp.usage.prompt_tokens + 6 <= CONTEXT
        messages.append({"role": "assistant", "content": resp.choices[0].message.content or "ok"})
        i += 1
    assert shifted_turns >= 1 and rendered >= 4 * CONTEXT


def test_a_conversation_grown_turn_by_turn_to_four_contexts_is_read_whole_under_a_policy(small):
    client, model = small
    messages = [{"role": "system", "content": "You keep notes."}]
    rendered, i = 0, 0
    while rendered < 4 * CONTEXT:
        messages.append(turn(2 * i))
        resp = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                              extra_body={"context_overflow": POLICY})
        info = tern(resp)["context_overflow"]
        rendered = resp.usage.prompt_tokens
        assert info["prompt_tokens"] == rendered
        # Nothing is evicted while the conversation fits.
        fits = rendered + resp.usage.completion_tokens - 1 <= CONTEXT
        assert (info["shifts"] == 0) == fits, (rendered, info)
        messages.append({"role": "assistant", "content": resp.choices[0].message.content or "ok"})
        i += 1
    assert info["shifts"] >= 3


def test_a_real_model_served_with_a_smaller_ctx_goes_past_it_under_streaming():
    """SmolLM2 (trained for 8192) served with `--ctx 256`: the window holds
    requests that do not name a rule, and a conversation four windows long is
    answered under StreamingLLM's sinks and recent window."""
    from conftest import MODEL

    with running_server(MODEL, "smollm2-135m-instruct", ("--ctx", "256")) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)
        model = client.models.list().data[0].id
        long = [turn(i) for i in range(60)]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=long, max_tokens=8)
        assert "256" in e.value.body["message"], e.value.body
        resp = client.chat.completions.create(model=model, messages=long, max_tokens=24, temperature=0,
                                              extra_body={"context_overflow": "streaming:budget=128,sink=4"})
        info = tern(resp)["context_overflow"]
        assert resp.usage.prompt_tokens == info["prompt_tokens"] >= 4 * 256
        assert info["shifts"] >= 7 and info["kept_tokens"] <= 256, info
        # The newest note is still in view: the answer is words, not noise.
        assert resp.choices[0].message.content.strip()
        client.close()
