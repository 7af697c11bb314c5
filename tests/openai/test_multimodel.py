"""Several models in one `tern serve` (issue 63, item 5): `--model` repeated,
requests routed by `model`, each model loaded by the first request naming
it, unloaded after `--model-idle-unload`, and its weights and KV budget
charged against `--models-memory` while loaded (`/v1/models`' `tern`
objects and `/metrics` show it).

The models are SmolLM2-135M (Q4_1, models/cache) and tiny random-weight
Qwen3 files (tiny_gguf.py), so every load takes well under a second."""

from __future__ import annotations

import concurrent.futures
import time

import openai
import pytest

from conftest import API_KEY, MODEL, ROOT, httpx, running_server
from tiny_gguf import write_tiny_qwen3

SMOL = MODEL.stem  # "SmolLM2-135M-Instruct.Q4_1"
KV = 16 << 20  # --kv-memory: each loaded model's KV budget
IDLE_S = 1.5


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)


def models(url: str) -> tuple[dict, dict]:
    """(`{id: tern object}`, the list's `tern` object) from GET /v1/models."""
    r = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30.0)
    r.raise_for_status()
    body = r.json()
    return {m["id"]: m["tern"] for m in body["data"]}, body["tern"]


def ask(c: openai.OpenAI, model: str) -> str:
    resp = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                     max_tokens=2, temperature=0)
    assert resp.choices[0].message.content is not None
    return resp.model


def wait_for(url: str, model: str, state: str, limit_s: float = 30.0) -> dict:
    deadline = time.monotonic() + limit_s
    while True:
        seen, _ = models(url)
        if seen[model]["state"] == state:
            return seen
        assert time.monotonic() < deadline, f"{model} not {state} after {limit_s} s: {seen[model]}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_qwen3(tmp_path_factory.mktemp("multi") / "tiny-qwen3.gguf", ROOT)


def test_two_models_answer_by_name_and_an_idle_one_is_unloaded_and_reloaded(tiny):
    extra = ("--model", str(tiny), "--kv-memory", str(KV), "--model-idle-unload", str(IDLE_S))
    with running_server(MODEL, "smollm2-135m-instruct", extra) as url:
        c = client(url)
        seen, memory = models(url)
        assert {m: s["state"] for m, s in seen.items()} == {SMOL: "unloaded", "tiny-qwen3": "unloaded"}
        assert memory["memory_in_use_bytes"] == 0 and memory["idle_unload_s"] == IDLE_S
        charge = {m: s["weights_bytes"] + KV for m, s in seen.items()}
        assert seen[SMOL]["weights_bytes"] == (ROOT / MODEL).stat().st_size

        # Each answers under its own name; loading charges its weights and KV.
        assert ask(c, SMOL) == SMOL
        seen, memory = models(url)
        assert seen[SMOL]["state"] == "loaded" and seen[SMOL]["memory_bytes"] == charge[SMOL]
        assert ask(c, "tiny-qwen3") == "tiny-qwen3"
        seen, memory = models(url)
        assert seen["tiny-qwen3"] == {**seen["tiny-qwen3"], "state": "loaded", "loads": 1,
                                      "memory_bytes": charge["tiny-qwen3"]}
        assert memory["memory_in_use_bytes"] == sum(s["memory_bytes"] for s in seen.values())
        with pytest.raises(openai.NotFoundError) as e:
            ask(c, "no-such-model")
        assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"

        # Left idle, tiny-qwen3 is unloaded and its charge given back, while
        # SmolLM2, used all along, stays.
        deadline = time.monotonic() + 30
        while (seen := models(url)[0])["tiny-qwen3"]["state"] != "unloaded":
            assert time.monotonic() < deadline, seen
            assert ask(c, SMOL) == SMOL
        seen, memory = models(url)
        assert seen[SMOL]["state"] == "loaded"
        assert seen["tiny-qwen3"]["memory_bytes"] == 0 and seen["tiny-qwen3"]["loads"] == 1
        assert memory["memory_in_use_bytes"] == charge[SMOL]
        metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
        assert 'tern_model_loaded{model="tiny-qwen3"} 0' in metrics
        assert f"tern_models_memory_bytes {charge[SMOL]}" in metrics

        # The next request loads it again; concurrent first requests load it once.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert list(pool.map(lambda _: ask(c, "tiny-qwen3"), range(4))) == ["tiny-qwen3"] * 4
        seen, memory = models(url)
        assert seen["tiny-qwen3"]["loads"] == 2 and seen["tiny-qwen3"]["state"] == "loaded"
        assert seen["tiny-qwen3"]["memory_bytes"] == charge["tiny-qwen3"]
        assert memory["memory_in_use_bytes"] == sum(s["memory_bytes"] for s in seen.values())
        c.close()


def test_a_model_that_does_not_fit_unloads_the_least_recently_used_or_is_a_503(tiny, tmp_path):
    other = write_tiny_qwen3(tmp_path / "tiny-qwen3-b.gguf", ROOT, seed=8)
    smol = (ROOT / MODEL).stat().st_size + KV
    small = tiny.stat().st_size + KV
    # Any two of the three fit; all three do not. Never unloaded for idleness.
    budget = smol + small + small // 2
    big = ROOT / "models/cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    extra = ("--model", str(tiny), "--model", str(other), "--kv-memory", str(KV),
             "--models-memory", str(budget), "--model-idle-unload", "0")
    if big.exists():
        extra += ("--model", str(big))
    with running_server(MODEL, "smollm2-135m-instruct", extra) as url:
        c = client(url)
        assert ask(c, SMOL) == SMOL
        assert ask(c, "tiny-qwen3") == "tiny-qwen3"
        # Room for tiny-qwen3-b: SmolLM2, the least recently used, goes.
        assert ask(c, "tiny-qwen3-b") == "tiny-qwen3-b"
        seen, memory = models(url)
        assert {m: s["state"] for m, s in seen.items() if m != big.stem} == {
            SMOL: "unloaded", "tiny-qwen3": "loaded", "tiny-qwen3-b": "loaded"}
        assert memory["memory_in_use_bytes"] == 2 * small <= memory["memory_budget_bytes"] == budget
        # The Anthropic, Responses and embeddings endpoints route by name too.
        auth = {"Authorization": f"Bearer {API_KEY}"}
        r = httpx.post(f"{url}/v1/messages", headers=auth, timeout=60.0, json={
            "model": "tiny-qwen3", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200 and r.json()["model"] == "tiny-qwen3", r.text
        assert c.responses.create(model="tiny-qwen3-b", input="Hi", max_output_tokens=2).model == "tiny-qwen3-b"
        assert c.embeddings.create(model="tiny-qwen3", input="Hi").model == "tiny-qwen3"
        if big.exists():
            # More than the whole budget: a 503 naming the flag, nothing unloaded.
            with pytest.raises(openai.InternalServerError) as e:
                ask(c, big.stem)
            assert e.value.status_code == 503 and e.value.body["code"] == "models_memory_full"
            assert "--models-memory" in e.value.body["message"]
            assert models(url)[1]["memory_in_use_bytes"] == 2 * small
        c.close()
