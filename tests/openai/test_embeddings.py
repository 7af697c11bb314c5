"""`/v1/embeddings` through the official SDK on the real model.

Only properties every embedding must have are asserted: OpenAI's shapes,
unit norm, determinism, a batch equal to single requests, `base64` equal to
`float`, `dimensions` as a renormalised prefix, and bad input as a 400 that
names the field. (Whether related texts land closer than unrelated ones is
not something a 135M chat model promises, so it is not tested.)
"""

from __future__ import annotations

import base64
import math
import struct

import openai
import pytest

from conftest import API_KEY, MODEL, running_server

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.", "ok"]


def norm(v) -> float:
    return math.sqrt(sum(x * x for x in v))


def max_diff(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def floats(client, model_id, input, **kw):
    resp = client.embeddings.create(model=model_id, input=input, encoding_format="float", **kw)
    return resp, [d.embedding for d in resp.data]


@pytest.fixture(scope="module")
def hidden_size(client, model_id) -> int:
    return len(floats(client, model_id, "size")[1][0])


def test_embed_one_string(client, model_id, http):
    resp, (vec,) = floats(client, model_id, TEXTS[0])
    assert resp.object == "list"
    assert resp.model == model_id
    assert len(resp.data) == 1
    assert resp.data[0].object == "embedding" and resp.data[0].index == 0
    assert len(vec) == 576  # SmolLM2-135M's hidden size
    assert abs(norm(vec) - 1.0) < 1e-5
    tokens = http.post("/tokenize", json={"content": TEXTS[0], "add_special": True}).json()["tokens"]
    assert resp.usage.prompt_tokens == len(tokens)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens


def test_embed_list_keeps_order_and_is_deterministic(client, model_id):
    resp, batch = floats(client, model_id, TEXTS)
    assert [d.index for d in resp.data] == [0, 1, 2]
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > len(TEXTS)
    for text, b in zip(TEXTS, batch):
        _, (first,) = floats(client, model_id, text)
        _, (second,) = floats(client, model_id, text)
        assert first == second, "the same input twice gave different vectors"
        assert max_diff(first, b) < 1e-5, "a batch differs from single requests"
        assert abs(norm(b) - 1.0) < 1e-5
    assert max_diff(batch[0], batch[1]) > 1e-3


def test_embed_base64_decodes_to_the_floats(client, model_id):
    _, (vec,) = floats(client, model_id, TEXTS[1])
    resp = client.embeddings.create(model=model_id, input=TEXTS[1], encoding_format="base64")
    raw = base64.b64decode(resp.data[0].embedding)
    decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert max_diff(decoded, vec) < 1e-6
    # The SDK asks for base64 by default and decodes it itself.
    default = client.embeddings.create(model=model_id, input=TEXTS[1])
    assert max_diff(list(default.data[0].embedding), vec) < 1e-6


def test_embed_dimensions_64(client, model_id):
    _, (full,) = floats(client, model_id, TEXTS[0])
    _, short = floats(client, model_id, TEXTS[:2], dimensions=64)
    assert [len(v) for v in short] == [64, 64]
    for v in short:
        assert abs(norm(v) - 1.0) < 1e-5
    scale = norm(full[:64])
    assert max_diff(short[0], [x / scale for x in full[:64]]) < 1e-6


def test_embed_token_inputs(client, model_id, http):
    ids = http.post("/tokenize", json={"content": TEXTS[1], "add_special": True}).json()["tokens"]
    _, (from_text,) = floats(client, model_id, TEXTS[1])
    _, (from_ids,) = floats(client, model_id, ids)
    assert max_diff(from_ids, from_text) < 1e-6
    _, lists = floats(client, model_id, [ids, ids[:3]])
    assert len(lists) == 2 and max_diff(lists[0], from_text) < 1e-5


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["fine", ""]}, "input"),
        ({"input": [[1, 2], []]}, "input"),
        ({"input": [10_000_000]}, "input"),
        ({"input": [1] * 9000}, "input"),  # past SmolLM2's 8192-token context
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 577}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ],
)
def test_embed_bad_input_is_bad_request(client, model_id, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model_id, **kwargs)
    assert e.value.status_code == 400
    assert e.value.param == param
    # The server still serves.
    _, (vec,) = floats(client, model_id, "still here")
    assert abs(norm(vec) - 1.0) < 1e-5


def test_embed_context_error_carries_the_numbers(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model_id, input=[1] * 9000, encoding_format="float")
    assert e.value.code == "context_length_exceeded"
    assert "9000" in str(e.value)


def test_embed_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert e.value.code == "model_not_found"


@pytest.fixture(scope="module")
def last_client():
    """A second server started with `--embedding-pooling last`."""
    extra = ("--kv-memory", "512MiB", "--embedding-pooling", "last")
    with running_server(MODEL, "smollm2-135m-instruct", extra) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)
        yield c
        c.close()


def test_embed_last_token_pooling_flag(client, last_client, model_id, http):
    ids = http.post("/tokenize", json={"content": TEXTS[0], "add_special": True}).json()["tokens"]
    # One token: the last token's state is the mean.
    _, (mean_one,) = floats(client, model_id, ids[:1])
    _, (last_one,) = floats(last_client, model_id, ids[:1])
    assert max_diff(mean_one, last_one) < 1e-6
    # Several: a unit vector that is not the mean.
    _, (mean_all,) = floats(client, model_id, ids)
    _, (last_all,) = floats(last_client, model_id, ids)
    assert abs(norm(last_all) - 1.0) < 1e-5
    assert max_diff(mean_all, last_all) > 1e-3
