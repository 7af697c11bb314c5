"""llama-server's `/tokenize` and `/detokenize`, and `GET /v1/models/{id}`,
on the real model over raw HTTP (the SDK has no tokenizer calls)."""

from __future__ import annotations

import openai
import pytest

from conftest import API_KEY, httpx
from test_bad_input import assert_error

TEXT = "Hello, world! Ünïcode and <|im_start|> too."


def test_tokenize_round_trip(http):
    r = http.post("/tokenize", json={"content": TEXT})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    assert ids and all(isinstance(t, int) for t in ids)
    # llama-server parses control-token text by default: <|im_start|> is one token.
    im_start = http.post("/tokenize", json={"content": "<|im_start|>"}).json()["tokens"]
    assert len(im_start) == 1 and im_start[0] in ids
    d = http.post("/detokenize", json={"tokens": ids})
    assert d.status_code == 200, d.text
    assert d.json() == {"content": TEXT}


def test_tokenize_with_pieces(http):
    plain = http.post("/tokenize", json={"content": TEXT}).json()["tokens"]
    r = http.post("/tokenize", json={"content": TEXT, "with_pieces": True})
    assert r.status_code == 200, r.text
    entries = r.json()["tokens"]
    assert [e["id"] for e in entries] == plain
    raw = b""
    for e in entries:
        p = e["piece"]
        raw += p.encode() if isinstance(p, str) else bytes(p)
    assert raw.decode() == TEXT


def test_tokenize_add_special_follows_the_model(http):
    without = http.post("/tokenize", json={"content": "hi"}).json()["tokens"]
    with_special = http.post("/tokenize", json={"content": "hi", "add_special": True}).json()["tokens"]
    # SmolLM2 adds no BOS, so both agree; a model that adds one gets it first.
    assert with_special[-len(without):] == without


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/detokenize", {"tokens": [1, 10_000_000]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/tokenize", {"with_pieces": True}, "content"),
        ("/tokenize", {"content": 5}, "content"),
    ],
)
def test_tokenizer_bad_input(http, path, body, param):
    assert_error(http.post(path, json=body), 400, param=param)
    assert http.post("/tokenize", json={"content": "x"}).status_code == 200


def test_tokenizer_routes_need_the_key(server_url):
    for path in ("/tokenize", "/detokenize"):
        r = httpx.post(f"{server_url}{path}", json={"content": "x", "tokens": [1]}, timeout=10.0)
        assert_error(r, 401, code="invalid_api_key")
        r = httpx.post(
            f"{server_url}{path}",
            json={"content": "x", "tokens": [1]},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=10.0,
        )
        assert r.status_code == 200, r.text


def test_model_retrieve(client, model_id):
    m = client.models.retrieve(model_id)
    assert m.id == model_id and m.object == "model" and m.owned_by == "tern"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.status_code == 404
    assert e.value.code == "model_not_found"
