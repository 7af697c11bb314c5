"""The second real model, Gemma 3 270M (base, Q4_K_M, sliding-window layers,
SentencePiece vocabulary), served and driven through the official SDK.

It has no chat template, so completions must work and chat must be refused
with a clear 400; a KV policy must apply to it per request; and what the
server answers greedily must be what the in-process llama.cpp backend
generates for the same prompt.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import openai
import pytest

from conftest import API_KEY, BINARY, ROOT, running_server

GEMMA = Path("models/cache/gemma-3-270m-q4_k_m.gguf")
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gemma():
    with running_server(GEMMA, "gemma3-270m", ("--kv-memory", "1GiB")) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)
        yield c, c.models.list().data[0].id
        c.close()


def tern_info(resp) -> dict:
    info = (resp.model_extra or {}).get("tern", resp.to_dict().get("tern"))
    assert isinstance(info, dict), f"no `tern` object in {resp.to_dict()}"
    return info


def llama_cpp_greedy(prompt: str, n: int) -> str:
    out = subprocess.run(
        [str(BINARY), "generate", "--model", str(GEMMA), "-p", prompt, "-n", str(n),
         "--temperature", "0", "--backend", "llama-cpp",
         # One thread: ggml's workers spin at barriers and stall when the
         # machine is oversubscribed (tests/support/mod.rs, LLAMA_THREADS).
         "--threads", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_completions_equal_llama_cpp_greedy(gemma):
    client, model_id = gemma
    resp = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=16, temperature=0)
    assert resp.object == "text_completion"
    choice = resp.choices[0]
    assert choice.text.strip(), resp
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens <= 16
    # `tern generate` prints the continuation and a newline.
    assert llama_cpp_greedy(PROMPT, 16).rstrip("\n") == choice.text.rstrip("\n")

    stream = client.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=16, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].text for c in stream if c.choices)
    assert streamed == choice.text


def test_chat_is_refused_without_a_template(gemma):
    client, model_id = gemma
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
    err = e.value.body
    assert "template" in err["message"], err
    # The refusal costs the server nothing: completions still answer.
    ok = client.completions.create(model=model_id, prompt="Hello", max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_kv_policy_on_gemma(gemma):
    client, model_id = gemma
    long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 20)
    resp = client.completions.create(
        model=model_id,
        prompt=long_prompt + " The fox",
        max_tokens=8,
        temperature=0,
        extra_body={"kv_policy": "snapkv:budget=32"},
    )
    info = tern_info(resp)
    assert info["kv_policy"].startswith("snapkv"), info
    assert resp.usage.prompt_tokens > 32
    # Sliding layers keep their window; the 3 global layers hold the budget.
    assert 0 < info["kv_bytes"] < info["kv_bytes_full"], info
