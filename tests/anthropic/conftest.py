"""Fixtures for the Anthropic-compatibility suite: the official `anthropic`
SDK, unmodified, pointed at one real `tern serve` per session.

The server is started as tests/openai starts it (that suite's
`running_server`: a free localhost port, API key `test-key`, stopped when
the session ends), on Qwen2.5-Coder-0.5B-Instruct, the smallest model that
writes real tool calls. Build first: `cargo build --release`.

Run: `python3 -m pytest -q tests/anthropic` from the repository root.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import anthropic
import openai
import pytest

_OPENAI_CONFTEST = Path(__file__).resolve().parents[1] / "openai" / "conftest.py"
# Loaded under its own name, since both suites' fixture files are conftest.py.
_spec = importlib.util.spec_from_file_location("tern_openai_conftest", _OPENAI_CONFTEST)
_openai_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_openai_conftest)
# Its names are this module's too: when both suites run in one pytest session,
# `conftest` is whichever of the two was imported last, and tests/openai's
# modules import their helpers from it by that name. (The fixtures defined
# below replace that suite's for this directory.)
globals().update({k: v for k, v in vars(_openai_conftest).items() if not k.startswith("__")})

API_KEY = _openai_conftest.API_KEY
QWEN = Path("models/cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")


@pytest.fixture(scope="session")
def api_key() -> str:
    """The key the server was started with."""
    return API_KEY


@pytest.fixture(scope="session")
def server_url():
    """Base URL of a `tern serve` running Qwen2.5-Coder-0.5B-Instruct."""
    with _openai_conftest.running_server(QWEN, "qwen2.5-coder-0.5b-instruct", ("--kv-memory", "1GiB")) as url:
        yield url


@pytest.fixture(scope="session")
def client(server_url) -> anthropic.Anthropic:
    """The Anthropic SDK pointed at the server; it sends the key as
    `x-api-key` (no retries: failures show as they are)."""
    c = anthropic.Anthropic(base_url=server_url, api_key=API_KEY, max_retries=0, timeout=300.0)
    yield c
    c.close()


@pytest.fixture(scope="session")
def openai_client(server_url) -> openai.OpenAI:
    """The OpenAI SDK on the same server, to compare with the chat path."""
    c = openai.OpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0, timeout=300.0)
    yield c
    c.close()


@pytest.fixture(scope="session")
def model_id(openai_client) -> str:
    """The id the server serves, as `/v1/models` reports it."""
    return openai_client.models.list().data[0].id


@pytest.fixture(scope="session")
def http(server_url):
    """A raw HTTP client sending the key as `x-api-key`, for requests the SDK
    would not send."""
    with _openai_conftest.httpx.Client(base_url=server_url, headers={"x-api-key": API_KEY}, timeout=300.0) as c:
        yield c
