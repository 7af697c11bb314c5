"""Tool calls as Qwen2.5-Coder-0.5B-Instruct actually writes them, under
`tool_choice: auto`: the model may answer with a `<tool_call>` block or a
bare JSON object naming the tool; either comes back as an OpenAI tool call
(whole, and streamed as deltas while generated), and a question that needs
no tool gets prose. Two short requests on the 0.5B (the smallest model that
writes real calls); the 1.5B agents record is scripts/agents_eval.py's."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from conftest import API_KEY, running_server

QWEN = Path("models/cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
TOOLS = [{
    "type": "function",
    "function": {
        "name": "lookup_price",
        "description": "The price in US dollars of one unit of an item.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
    },
}]
ASK = [
    {"role": "system", "content": "Prices are known only through your tools: always call them."},
    {"role": "user", "content": "What is the price of one sprocket?"},
]


@pytest.fixture(scope="module")
def qwen():
    with running_server(QWEN, "qwen2.5-coder-0.5b-instruct", ("--kv-memory", "1GiB")) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=300.0)
        yield c, c.models.list().data[0].id
        c.close()


def test_an_auto_call_comes_back_as_a_tool_call_whole_and_streamed(qwen):
    client, model = qwen
    resp = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=60,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "lookup_price"
    assert "sprocket" in json.loads(call.function.arguments)["item"].lower()
    chunks = list(client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=60, stream=True,
    ))
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].function.name == "lookup_price" and deltas[0].id.startswith("call_")
    assert len(deltas) >= 3  # the name, then the arguments in fragments
    assert json.loads("".join(d.function.arguments for d in deltas)) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices and c.choices[0].delta.content for c in chunks), "the call leaked as content"


def test_a_reply_naming_no_declared_tool_stays_text(qwen):
    # The auto grammar engages only once a call to a declared tool begins.
    # Asked something no tool serves, the 0.5B answers with a JSON object
    # naming a function it invented (`{"name": "hello", ...}`): that is
    # text, returned as the model wrote it, never a call the client cannot run.
    client, model = qwen
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Write the word hello in French, nothing else."}],
        tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=24,
    )
    choice = resp.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert choice.message.content.strip()
    assert "lookup_price" not in choice.message.content
