"""A reasoning model's `<think>` block comes back as `reasoning_content`
(whole, and as its own stream deltas), as llama-server's `reasoning_format`
returns it, and a thinking budget closes the block, not the answer.

The model is a tiny random-weight Qwen3 with Qwen3's real vocabulary and chat
template (tiny_gguf.py): its own words are noise, so the first tests force
the reply's text with a grammar, and the budget tests use a template that
opens the block in the prompt (as thinking-only templates do), so that
whatever the model writes is reasoning until it is closed."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from conftest import API_KEY, ROOT, running_server
from tiny_gguf import write_tiny_qwen3

REASONING = "I add two and two."
ANSWER = "It is 4."
# The whole reply, tags and all, as the grammar forces it.
REPLY = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"
GRAMMAR = 'start: "<think>\\n' + REASONING + '\\n</think>\\n\\n' + ANSWER + '"'
ASK = [{"role": "user", "content": "What is 2+2?"}]


def serve(tmp: Path, opened: bool):
    model = write_tiny_qwen3(tmp / ("tiny-qwen3-opened.gguf" if opened else "tiny-qwen3.gguf"), ROOT, opened)
    return running_server(model, "", ("--kv-memory", "256MiB"))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("qwen3"), opened=False) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)
        yield c, c.models.list().data[0].id
        c.close()


@pytest.fixture(scope="module")
def qwen3_opened(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("qwen3o"), opened=True) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)
        yield c, c.models.list().data[0].id
        c.close()


def reasoning_of(x) -> str | None:
    return getattr(x, "reasoning_content", None)


def test_the_think_block_comes_back_as_reasoning_content_whole_and_streamed(qwen3):
    client, model = qwen3
    args = dict(model=model, messages=ASK, temperature=0, max_tokens=60, extra_body={"grammar": GRAMMAR})
    message = client.chat.completions.create(**args).choices[0].message
    assert reasoning_of(message) == REASONING
    assert message.content == ANSWER
    chunks = list(client.chat.completions.create(**args, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(reasoning_of(d) or "" for d in deltas) == REASONING
    assert "".join(d.content or "" for d in deltas) == ANSWER
    # The reasoning arrives as its own deltas, all before the answer's text.
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert any(reasoning_of(d) for d in deltas[:first_answer])
    assert not any(reasoning_of(d) for d in deltas[first_answer:])


def test_reasoning_format_none_leaves_the_block_in_content(qwen3):
    client, model = qwen3
    for stream in (False, True):
        resp = client.chat.completions.create(
            model=model, messages=ASK, temperature=0, max_tokens=60, stream=stream,
            extra_body={"grammar": GRAMMAR, "reasoning_format": "none"},
        )
        if stream:
            deltas = [c.choices[0].delta for c in resp if c.choices]
            content = "".join(d.content or "" for d in deltas)
            assert not any(reasoning_of(d) for d in deltas)
        else:
            content = resp.choices[0].message.content
            assert reasoning_of(resp.choices[0].message) is None
        assert content == REPLY
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4,
                                       extra_body={"reasoning_format": "think"})
    assert e.value.body["param"] == "reasoning_format"


def test_a_responses_reply_leads_with_a_reasoning_item(qwen3_opened):
    client, model = qwen3_opened
    chat = client.chat.completions.create(model=model, messages=ASK, temperature=0, max_tokens=16)
    r = client.responses.create(model=model, input=ASK[0]["content"], temperature=0, max_output_tokens=16)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"], kinds
    assert r.output[0].content[0].text == reasoning_of(chat.choices[0].message)
    assert r.output_text == ""
    events = list(client.responses.create(model=model, input=ASK[0]["content"], temperature=0,
                                          max_output_tokens=16, stream=True))
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert [e.text for e in done] == [r.output[0].content[0].text]
    assert not any(e.type == "response.output_text.delta" and e.delta for e in events)


def test_a_block_the_prompt_opened_is_reasoning_and_the_budget_closes_it(qwen3_opened):
    client, model = qwen3_opened
    args = dict(model=model, messages=ASK, temperature=0, max_tokens=16)
    # No budget: the block never closes within max_tokens, so all of the
    # reply is reasoning and the answer is empty (llama.cpp's reading).
    free = client.chat.completions.create(**args).choices[0].message
    assert reasoning_of(free) and free.content == ""
    # A budget of 4 tokens: the same first words (greedy), then the block is
    # closed for the model and the rest of max_tokens is its answer.
    cut = client.chat.completions.create(**args, extra_body={"thinking_budget_tokens": 4})
    message = cut.choices[0].message
    assert reasoning_of(message) and free.reasoning_content.startswith(reasoning_of(message))
    assert len(reasoning_of(message)) < len(free.reasoning_content)
    assert message.content, "the answer after the closed block is empty"
    assert "</think>" not in message.content
    chunks = list(client.chat.completions.create(**args, stream=True, extra_body={"thinking_budget_tokens": 4}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(reasoning_of(d) or "" for d in deltas) == reasoning_of(message)
    assert "".join(d.content or "" for d in deltas) == message.content
