"""`/v1/messages` and `/v1/messages/count_tokens` through the official
`anthropic` SDK, unmodified: a message (the same greedy answer and counts
as chat completions give for the same conversation), a streamed message
(Anthropic's event order, the same text), a tool-use round trip (the model
calls a tool, the client sends a `tool_result`, the model answers with it),
a streamed tool call, stop sequences, count_tokens, and errors in
Anthropic's shape. Greedy throughout; `temperature` goes in the body, as
this SDK takes it."""

from __future__ import annotations

import json

import anthropic
import pytest

SYSTEM = "You are a helpful assistant. Answer in one short sentence."
ASK = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}
TOOLS = [{
    "name": "lookup_price",
    "description": "The price in US dollars of one unit of an item.",
    "input_schema": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
}]
TOOL_SYSTEM = (
    "You answer questions about prices. Look prices up with your tools; "
    "once a tool result arrives, state the price in one sentence."
)
ASK_PRICE = [{"role": "user", "content": "What is the price of one sprocket?"}]


def message(client, model_id, **kw):
    args = {"model": model_id, "max_tokens": 40, "system": SYSTEM, "messages": ASK, "extra_body": GREEDY}
    return client.messages.create(**{**args, **kw})


def test_a_message_is_the_chat_answer_in_anthropic_shape(client, openai_client, model_id):
    msg = message(client, model_id)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.model == model_id
    (block,) = msg.content
    assert block.type == "text" and block.text.strip()
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    assert msg.usage.input_tokens > 0 and 0 < msg.usage.output_tokens <= 40
    # One engine path: chat completions answer the same conversation alike.
    chat = openai_client.chat.completions.create(
        model=model_id, max_tokens=40, temperature=0, messages=[{"role": "system", "content": SYSTEM}, *ASK],
    )
    assert block.text == chat.choices[0].message.content
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert msg.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]


def test_a_streamed_message_in_anthropic_event_order(client, model_id):
    whole = message(client, model_id)
    events = list(message(client, model_id, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["message_start", "content_block_start"], types
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"], types
    assert set(types[2:-3]) == {"content_block_delta"}, types
    start, delta = events[0], events[-2]
    assert start.message.id.startswith("msg_") and start.message.content == []
    assert start.message.usage.input_tokens == whole.usage.input_tokens
    assert events[1].index == 0 and events[1].content_block.type == "text"
    assert "".join(e.delta.text for e in events[2:-3]) == whole.content[0].text
    assert delta.delta.stop_reason == whole.stop_reason and delta.delta.stop_sequence is None
    assert delta.usage.output_tokens == whole.usage.output_tokens
    # The SDK's stream helper assembles the same message.
    with client.messages.stream(model=model_id, max_tokens=40, system=SYSTEM, messages=ASK, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_a_tool_use_round_trip(client, model_id):
    first = client.messages.create(
        model=model_id, max_tokens=60, system=TOOL_SYSTEM, messages=ASK_PRICE, tools=TOOLS,
        tool_choice={"type": "auto"}, extra_body=GREEDY,
    )
    assert first.stop_reason == "tool_use", first
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "lookup_price" and use.id.startswith("toolu_")
    assert "sprocket" in use.input["item"].lower()
    conversation = ASK_PRICE + [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "4.25"}]},
    ]
    final = client.messages.create(
        model=model_id, max_tokens=60, system=TOOL_SYSTEM, messages=conversation, tools=TOOLS,
        tool_choice={"type": "none"}, extra_body=GREEDY,
    )
    assert final.stop_reason == "end_turn", final
    (answer,) = final.content
    assert answer.type == "text" and "4.25" in answer.text, answer
    # count_tokens reads the whole round trip as the answer did.
    counted = client.messages.count_tokens(
        model=model_id, system=TOOL_SYSTEM, messages=conversation, tools=TOOLS, tool_choice={"type": "none"},
    )
    assert counted.input_tokens == final.usage.input_tokens


def test_a_streamed_tool_call_arrives_as_input_json_deltas(client, model_id):
    with client.messages.stream(
        model=model_id, max_tokens=60, system=TOOL_SYSTEM, messages=ASK_PRICE, tools=TOOLS,
        tool_choice={"type": "tool", "name": "lookup_price"}, extra_body=GREEDY,
    ) as s:
        events = list(s)
        final = s.get_final_message()
    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert len(starts) == 1 and starts[0].content_block.name == "lookup_price"
    fragments = [e.delta.partial_json for e in events
                 if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(fragments) >= 2  # the arguments arrive while they are written
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert json.loads("".join(fragments)) == use.input and "item" in use.input
    assert final.stop_reason == "tool_use"


def test_stop_sequences_end_the_answer_and_are_named(client, model_id):
    text = message(client, model_id).content[0].text
    words = [w for w in text.split() if text.index(w) > 0]
    assert words, text
    stop = words[len(words) // 2]
    msg = message(client, model_id, stop_sequences=["never-written-zzz", stop])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert "".join(b.text for b in msg.content) == text[: text.index(stop)]
    streamed = list(message(client, model_id, stop_sequences=[stop], stream=True))
    assert streamed[-2].delta.stop_reason == "stop_sequence" and streamed[-2].delta.stop_sequence == stop


def test_count_tokens_is_the_prompt_a_message_reads(client, model_id):
    plain = client.messages.count_tokens(model=model_id, system=SYSTEM, messages=ASK)
    assert plain.input_tokens == message(client, model_id, max_tokens=1).usage.input_tokens > 0
    with_tools = client.messages.count_tokens(model=model_id, system=TOOL_SYSTEM, messages=ASK_PRICE, tools=TOOLS)
    without = client.messages.count_tokens(model=model_id, system=TOOL_SYSTEM, messages=ASK_PRICE)
    assert with_tools.input_tokens > without.input_tokens


TINY_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


def test_errors_come_in_anthropic_shape(client, model_id, server_url, http, api_key):
    image = [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": TINY_PNG}},
        {"type": "text", "text": "What is this?"},
    ]}]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=model_id, max_tokens=10, messages=image)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "text only" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        message(client, model_id, extra_body={"temperature": 3})
    with pytest.raises(anthropic.NotFoundError) as e:
        message(client, "claude-that-is-not-here")
    assert e.value.body["error"]["type"] == "not_found_error"
    wrong = anthropic.Anthropic(base_url=server_url, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        message(wrong, model_id)
    assert e.value.body["error"]["type"] == "authentication_error"
    # `max_tokens` is required (the SDK will not send a request without it).
    r = http.post("/v1/messages", json={"model": model_id, "messages": ASK})
    assert r.status_code == 400, r.text
    assert r.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "Missing required parameter: `max_tokens`"}}
    # The key also works as a bearer token (the SDK's `auth_token`).
    bearer = anthropic.Anthropic(base_url=server_url, auth_token=api_key, api_key=None, max_retries=0)
    assert bearer.messages.count_tokens(model=model_id, messages=ASK).input_tokens > 0
    # And the server goes on answering.
    assert message(client, model_id, max_tokens=3).usage.output_tokens > 0
