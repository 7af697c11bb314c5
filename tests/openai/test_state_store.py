"""Two `tern serve` replicas sharing one Redis server as their Responses store
(`--state-store`, docs/SCALING.md): a conversation begun on one continues on
the other, a response stored by one is read and deleted through the other,
and a store that goes away is a 503, not a 404. Needs redis-server
(scripts/test.sh installs it)."""

from __future__ import annotations

import contextlib

import openai
import pytest

from conftest import API_KEY, MODEL, httpx, running_redis, running_server_proc

@pytest.fixture(scope="module")
def replicas():
    """`([replica URL, replica URL], redis process)` sharing one store."""
    with running_redis() as (store_url, redis), contextlib.ExitStack() as stack:
        store = ("--threads", "1", "--state-store", store_url)
        urls = [stack.enter_context(running_server_proc(MODEL, "smollm2-135m-instruct", store))[0] for _ in range(2)]
        yield urls, redis


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)


def test_a_conversation_continues_on_another_replica(replicas):
    (a_url, b_url), _ = replicas
    a, b = sdk(a_url), sdk(b_url)
    model_id = a.models.list().data[0].id
    first = a.responses.create(model=model_id, input="What is the capital of France?", max_output_tokens=20, temperature=0)
    second = b.responses.create(
        model=model_id, input="And of Italy?", previous_response_id=first.id, max_output_tokens=20, temperature=0
    )
    # The second turn's prompt held the first one, read from the shared store.
    alone = b.responses.create(model=model_id, input="And of Italy?", max_output_tokens=1, temperature=0)
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    assert a.responses.retrieve(second.id).output_text == second.output_text
    b.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(first.id)


def test_a_store_that_goes_away_is_a_503_not_a_404(replicas):
    (a_url, _), redis = replicas
    redis.kill()
    redis.wait()
    r = httpx.get(f"{a_url}/v1/responses/resp_x", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "state_store_unavailable"
