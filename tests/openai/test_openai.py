"""The official `openai` Python SDK against `tern serve` on the real model.

Covers chat and legacy completions (plain and streamed), n, logprobs, stop
strings, seeds, usage in streams, JSON mode, Tern's `kv_policy` / `tern`
extensions, model listing and the SDK's error classes. Generations are kept
short (8-24 tokens, 64 for JSON) so the suite runs in well under 3 minutes.
"""

from __future__ import annotations

import json
import math
import re

import openai
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
STORY = [{"role": "user", "content": "Tell me a short story about a dragon who loves books."}]


def tern_info(resp) -> dict:
    """The `tern` extension object of a response (an extra field for the SDK)."""
    extra = resp.model_extra or {}
    info = extra.get("tern", resp.to_dict().get("tern"))
    assert isinstance(info, dict), f"no `tern` object in {resp.to_dict()}"
    return info


def check_usage(usage, max_tokens: int, finish_reason: str | None = None) -> None:
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= max_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if finish_reason == "length":
        assert usage.completion_tokens == max_tokens


def collect_chat_stream(stream):
    """Chunks -> (chunks, {index: text}, {index: [finish_reasons]})."""
    chunks, texts, finishes = [], {}, {}
    for chunk in stream:
        chunks.append(chunk)
        for choice in chunk.choices:
            texts.setdefault(choice.index, "")
            finishes.setdefault(choice.index, [])
            if choice.delta.content:
                texts[choice.index] += choice.delta.content
            if choice.finish_reason is not None:
                finishes[choice.index].append(choice.finish_reason)
    return chunks, texts, finishes


# --- chat ------------------------------------------------------------------


def test_chat_non_stream(client, model_id):
    resp = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=16, temperature=0)
    assert resp.object == "chat.completion"
    assert resp.id
    assert resp.model == model_id
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    check_usage(resp.usage, 16, choice.finish_reason)
    info = tern_info(resp)
    for key in ("kv_policy", "kv_bytes", "kv_bytes_full", "prompt_tokens"):
        assert key in info, info
    assert info["prompt_tokens"] == resp.usage.prompt_tokens
    assert info["kv_policy"].startswith("full"), "the server's default policy is full"
    assert 0 < info["kv_bytes"] <= info["kv_bytes_full"]


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.8, 42)])
def test_chat_stream_matches_non_stream(client, model_id, temperature, seed):
    kwargs = dict(model=model_id, messages=STORY, max_tokens=16, temperature=temperature)
    if seed is not None:
        kwargs["seed"] = seed
    plain = client.chat.completions.create(**kwargs)
    chunks, texts, finishes = collect_chat_stream(client.chat.completions.create(stream=True, **kwargs))

    assert chunks, "the stream had no chunks"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1, "every chunk of a stream shares one id"
    first = chunks[0].choices[0]
    assert first.index == 0 and first.delta.role == "assistant"
    assert list(texts) == [0]
    assert len(finishes[0]) == 1, f"expected exactly one finish_reason, got {finishes[0]}"
    assert finishes[0][0] == plain.choices[0].finish_reason
    assert texts[0] == plain.choices[0].message.content
    assert all(c.usage is None for c in chunks), "no usage without stream_options.include_usage"


def test_chat_stream_n3_one_finish_per_choice(client, model_id):
    stream = client.chat.completions.create(
        model=model_id, messages=STORY, max_tokens=8, temperature=1, seed=3, n=3, stream=True
    )
    chunks, texts, finishes = collect_chat_stream(stream)
    assert sorted(texts) == [0, 1, 2]
    for i in range(3):
        assert len(finishes[i]) == 1, f"choice {i}: finish_reasons {finishes[i]}"
        assert finishes[i][0] in ("stop", "length")
        roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].index == i]
        assert roles[0] == "assistant", f"choice {i}: first delta has no assistant role"


def test_chat_n3(client, model_id):
    resp = client.chat.completions.create(model=model_id, messages=STORY, max_tokens=8, temperature=1, seed=5, n=3)
    assert sorted(c.index for c in resp.choices) == [0, 1, 2]
    for c in resp.choices:
        assert isinstance(c.message.content, str)
        assert c.finish_reason in ("stop", "length")
    assert 0 < resp.usage.completion_tokens <= 3 * 8
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_chat_logprobs(client, model_id):
    resp = client.chat.completions.create(
        model=model_id, messages=QUESTION, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    content = resp.choices[0].logprobs.content
    assert content, "logprobs.content is empty"
    # An end-of-sequence token is counted in usage but has no text to report.
    eos = 1 if resp.choices[0].finish_reason == "stop" else 0
    assert resp.usage.completion_tokens - eos <= len(content) <= resp.usage.completion_tokens
    for item in content:
        assert isinstance(item.token, str)
        assert item.logprob <= 0.0 and math.isfinite(item.logprob)
        tops = item.top_logprobs
        assert len(tops) == 3
        values = [t.logprob for t in tops]
        assert values == sorted(values, reverse=True), f"top_logprobs not descending: {values}"
        assert all(v <= 0.0 for v in values)
        for t in tops:
            if t.token == item.token:
                assert t.logprob == pytest.approx(item.logprob, abs=1e-4)
        # Greedy: the chosen token is the most likely one.
        assert item.logprob == pytest.approx(values[0], abs=1e-4)
    joined = "".join(item.token for item in content)
    assert joined == resp.choices[0].message.content


def test_chat_stop_string(client, model_id):
    messages = [{"role": "user", "content": "Describe the ocean in two sentences."}]
    base = client.chat.completions.create(model=model_id, messages=messages, max_tokens=24, temperature=0)
    text = base.choices[0].message.content
    # A word that first appears after the start, so the expected prefix is not empty.
    word = next(
        (w for w in re.findall(r"[A-Za-z]{3,}", text) if text.index(w) > 0),
        None,
    )
    assert word, f"no usable stop word in {text!r}"
    cut = client.chat.completions.create(
        model=model_id, messages=messages, max_tokens=24, temperature=0, stop=[word]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(word)]


def test_seed_reproducibility(client, model_id):
    def sample(seed: int) -> str:
        r = client.chat.completions.create(model=model_id, messages=STORY, max_tokens=16, temperature=1, seed=seed)
        return r.choices[0].message.content

    first = sample(1234)
    assert sample(1234) == first, "the same seed must give the same text"
    others = [sample(s) for s in (1, 2, 3)]
    assert any(t != first for t in others), f"seeds 1, 2, 3 all gave the text of seed 1234: {first!r}"


def test_stream_include_usage(client, model_id):
    stream = client.chat.completions.create(
        model=model_id,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == []
    check_usage(last.usage, 12)
    assert all(c.usage is None for c in chunks[:-1])
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert len(finishes) == 1
    check_usage(last.usage, 12, finishes[0])


def test_ignore_eos_makes_exactly_max_tokens(client, model_id):
    resp = client.chat.completions.create(
        model=model_id, messages=QUESTION, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 12


def test_json_object(client, model_id):
    messages = [
        {"role": "system", "content": "You answer with JSON only."},
        {"role": "user", "content": 'Give a JSON object with keys "name" and "age" for a person called Ann aged 30.'},
    ]
    resp = client.chat.completions.create(
        model=model_id, messages=messages, max_tokens=64, temperature=0, response_format={"type": "json_object"}
    )
    choice = resp.choices[0]
    content = choice.message.content
    assert content.lstrip().startswith("{"), content
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(content), dict), content
    else:
        assert choice.finish_reason == "length"


def test_kv_policy_extension(client, model_id):
    # A prompt well past the budget, so the policy has something to drop.
    long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 30)
    messages = [{"role": "user", "content": long_prompt + " What did the fox do?"}]
    resp = client.chat.completions.create(
        model=model_id,
        messages=messages,
        max_tokens=8,
        temperature=0,
        extra_body={"kv_policy": "snapkv:budget=64"},
    )
    info = tern_info(resp)
    assert info["kv_policy"].startswith("snapkv"), info
    assert "budget=64" in info["kv_policy"], info
    assert info["prompt_tokens"] == resp.usage.prompt_tokens > 64
    assert 0 < info["kv_bytes"] < info["kv_bytes_full"], info


# --- legacy completions --------------------------------------------------------


def test_completions_non_stream_and_stream(client, model_id):
    kwargs = dict(model=model_id, prompt="Once upon a time", max_tokens=12, temperature=0)
    plain = client.completions.create(**kwargs)
    assert plain.object == "text_completion"
    assert plain.model == model_id
    assert len(plain.choices) == 1
    choice = plain.choices[0]
    assert choice.index == 0
    assert isinstance(choice.text, str) and choice.text
    assert choice.finish_reason in ("stop", "length")
    check_usage(plain.usage, 12, choice.finish_reason)

    text, finishes = "", []
    for chunk in client.completions.create(stream=True, **kwargs):
        assert chunk.object == "text_completion"
        for c in chunk.choices:
            assert c.index == 0
            text += c.text or ""
            if c.finish_reason is not None:
                finishes.append(c.finish_reason)
    assert finishes == [choice.finish_reason]
    assert text == choice.text


# --- models and errors ---------------------------------------------------------


def test_models_list(client, model_id):
    ids = [m.id for m in client.models.list().data]
    assert model_id in ids
    assert "SmolLM2" in model_id or "smollm2" in model_id.lower()
    assert client.models.retrieve(model_id).id == model_id


def test_invalid_request_is_bad_request(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8, temperature=-1)
    assert e.value.status_code == 400
    assert e.value.param == "temperature"


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=QUESTION, max_tokens=8)


def test_wrong_key_is_authentication_error(server_url, model_id):
    bad = openai.OpenAI(base_url=f"{server_url}/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8)
    assert e.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    bad.close()


def test_best_of_majority_extension(client, model_id):
    """`best_of` + `aggregate` via extra_body: one aggregated choice, and the
    `tern` object lists every candidate, its extracted answer and the choice."""
    resp = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "What is 2 + 2? Reply with just the number."}],
        max_tokens=16,
        temperature=0.8,
        seed=5,
        extra_body={"best_of": 3, "aggregate": "majority"},
    )
    assert len(resp.choices) == 1
    tern = resp.to_dict()["tern"]
    assert tern["aggregate"] == "majority"
    assert tern["best_of"] == 3 and len(tern["candidates"]) == 3
    assert tern["tokens_spent"] == sum(c["tokens"] for c in tern["candidates"])
    assert resp.usage.completion_tokens == tern["tokens_spent"]
    chosen = tern["candidates"][tern["chosen"]]
    assert resp.choices[0].message.content == chosen["text"]
    assert tern["answer"] == chosen["answer"]


def test_best_of_synthesize_forces_a_missing_answer(client, model_id):
    """`aggregate: synthesize`: the reply is the synthesis, not a candidate.
    Four tokens leave it no room for its answer line and the question has
    no digits to copy, so the answer suffix is forced and reported."""
    resp = client.chat.completions.create(
        model=model_id,
        messages=[{
            "role": "user",
            "content": "Sara has seven pencils and gives away three. How many pencils does she have left?",
        }],
        max_tokens=4,
        temperature=0.7,
        seed=42,
        extra_body={"best_of": 3, "aggregate": "synthesize"},
    )
    tern = resp.to_dict()["tern"]
    assert tern["aggregate"] == "synthesize" and tern["chosen"] is None
    assert tern["forced_answer"] is True
    text = resp.choices[0].message.content
    assert "\n\nThe final answer is" in text
    # Candidates, the synthesis and the forced sentence are all billed.
    assert resp.usage.completion_tokens == tern["tokens_spent"]
    assert tern["tokens_spent"] > sum(c["tokens"] for c in tern["candidates"]) + 1


def test_best_of_rejects_bad_aggregate(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            extra_body={"best_of": 2, "aggregate": "telepathy"},
        )
    assert e.value.body["param"] == "aggregate"


# --- adaptive length ---------------------------------------------------------

ARITHMETIC = [{
    "role": "user",
    "content": "Tom has 3 apples and buys 5 more. How many apples does he have? Explain step by step.",
}]


def test_reasoning_effort_low_caps_the_reasoning(client, model_id):
    """`reasoning_effort` as the SDK's own parameter: the low cap (128
    reasoning tokens) holds, and the `tern` object reports what happened."""
    resp = client.chat.completions.create(
        model=model_id, messages=STORY, temperature=0, reasoning_effort="low",
    )
    r = tern_info(resp)["reasoning"]
    assert r["reasoning_effort"] == "low" and r["cap"] == 128
    assert r["probes"] == [] and not r["stopped_early"]
    assert r["reasoning_tokens"] <= 128
    assert resp.usage.completion_tokens == r["reasoning_tokens"] + r["answer_tokens"]
    if r["hit_cap"]:
        # The story was cut at the cap and the answer forced after it.
        assert r["reasoning_tokens"] == 128
        assert "The final answer is" in resp.choices[0].message.content


def test_thinking_budget_forces_the_answer(client, model_id):
    """`thinking_budget_tokens` via extra_body: the reasoning stops at the
    budget, the forced suffix follows, then a bounded answer."""
    resp = client.chat.completions.create(
        model=model_id, messages=STORY, temperature=0,
        extra_body={"thinking_budget_tokens": 24},
    )
    r = tern_info(resp)["reasoning"]
    assert r["reasoning_effort"] is None
    assert r["hit_cap"] and r["reasoning_tokens"] == 24 and r["tokens_saved"] == 0
    assert 0 < r["answer_tokens"] <= 48
    assert "The final answer is" in resp.choices[0].message.content


def test_each_of_n_choices_reasons_under_the_budget(client, model_id):
    """`n` with a thinking budget: every choice reasons, is forced to answer
    at the budget, and has its own report in `tern.reasoning.choices`."""
    resp = client.chat.completions.create(
        model=model_id, messages=STORY, temperature=0.8, seed=5, n=2,
        extra_body={"thinking_budget_tokens": 24},
    )
    r = tern_info(resp)["reasoning"]
    assert len(resp.choices) == 2 and len(r["choices"]) == 2
    for choice, c in zip(resp.choices, r["choices"]):
        assert c["cap"] == 24 and c["reasoning_tokens"] <= 24
        if c["hit_cap"]:
            assert c["reasoning_tokens"] == 24
            assert "The final answer is" in choice.message.content
    assert any(c["hit_cap"] for c in r["choices"])
    assert resp.usage.completion_tokens == sum(
        c["reasoning_tokens"] + c["answer_tokens"] for c in r["choices"])
    assert r["tokens_spent"] == sum(c["tokens_spent"] for c in r["choices"])
    assert resp.choices[0].message.content != resp.choices[1].message.content


def test_reasoning_effort_auto_probes_and_streams_the_same(client, model_id):
    """`auto` probes the answer every 64 tokens (forked, discarded) and
    reports each probe; a stream carries the same text and report."""
    kwargs = dict(
        model=model_id, messages=ARITHMETIC, temperature=0,
        reasoning_effort="auto", extra_body={"thinking_budget_tokens": 400},
    )
    resp = client.chat.completions.create(**kwargs)
    r = tern_info(resp)["reasoning"]
    assert r["reasoning_effort"] == "auto" and r["cap"] == 400
    for i, p in enumerate(r["probes"]):
        assert p["at"] == 64 * (i + 1)
        assert 0 < p["tokens"] <= 20
    assert r["probe_tokens"] == sum(p["tokens"] for p in r["probes"])
    assert r["tokens_spent"] == resp.usage.completion_tokens + r["probe_tokens"]
    if r["stopped_early"]:
        assert len(r["probes"]) >= 3
        assert r["tokens_saved"] == 400 - r["reasoning_tokens"]
    stream = client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True},
    )
    chunks, texts, _ = collect_chat_stream(stream)
    assert texts[0] == resp.choices[0].message.content
    assert chunks[-1].model_extra["tern"]["reasoning"] == r


def test_best_of_with_a_thinking_budget(client, model_id):
    """`best_of` and adaptive length together: every candidate reasons
    under the budget, is forced to answer at it, and reports its own probes;
    the usage bills candidates and probes alike."""
    resp = client.chat.completions.create(
        model=model_id, messages=STORY, temperature=0.8, seed=11,
        reasoning_effort="auto",
        extra_body={"best_of": 3, "aggregate": "majority", "thinking_budget_tokens": 24},
    )
    tern = resp.to_dict()["tern"]
    assert tern["best_of"] == 3 and len(tern["candidates"]) == 3
    spent = 0
    for c in tern["candidates"]:
        r = c["reasoning"]
        assert r["cap"] == 24 and r["reasoning_tokens"] <= 24
        assert c["tokens"] == r["reasoning_tokens"] + r["answer_tokens"]
        if r["hit_cap"]:
            assert "The final answer is" in c["text"]
        spent += c["tokens"] + r["probe_tokens"]
    assert any(c["reasoning"]["hit_cap"] for c in tern["candidates"])
    assert tern["tokens_spent"] == spent == resp.usage.completion_tokens
    assert tern["tokens_saved"] == sum(c["reasoning"]["tokens_saved"] for c in tern["candidates"])
    assert resp.choices[0].message.content == tern["candidates"][tern["chosen"]]["text"]


def test_shared_prompt_prefix_is_reused(client, model_id, metrics):
    """A second conversation starting like the first (the same system prompt and
    question, a different follow-up) reuses the first one's prompt KV: the
    server counts the reused tokens, and the same request made again (also
    served from the cache) gives the same greedy answer. Equality with a cold
    run is tested on the engine (tests/engine.rs)."""
    first = [
        {"role": "system", "content": "You are a careful assistant who answers briefly and plainly."},
        {"role": "user", "content": "List three fruits."},
    ]
    client.chat.completions.create(model=model_id, messages=first, max_tokens=8, temperature=0)
    before = metrics().get("tern_prompt_tokens_cached_total", 0.0)
    follow = first + [
        {"role": "assistant", "content": "Apple, banana, cherry."},
        {"role": "user", "content": "And three vegetables?"},
    ]
    a = client.chat.completions.create(model=model_id, messages=follow, max_tokens=16, temperature=0)
    after = metrics().get("tern_prompt_tokens_cached_total", 0.0)
    assert after - before >= 20, (before, after)
    b = client.chat.completions.create(model=model_id, messages=follow, max_tokens=16, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
