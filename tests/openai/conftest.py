"""Fixtures for the OpenAI-compatibility suite: one real `tern serve` per session.

The session starts `target/release/tern serve` on the real model
(SmolLM2-135M-Instruct) on a free localhost port with API key `test-key`,
waits for `GET /health` to answer 200, and stops it (SIGTERM, then SIGKILL
after 10 s) when the session ends. Build first: `cargo build --release`.

Run: `python3 -m pytest -q tests/openai` from the repository root.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import openai
import pytest

try:  # openai < 3 depends on httpx; later versions on its fork httpx2.
    import httpx
except ImportError:  # pragma: no cover
    import httpx2 as httpx  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "release" / "tern"
MODEL = Path("models/cache/SmolLM2-135M-Instruct.Q4_1.gguf")
API_KEY = "test-key"
STARTUP_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no server log)"


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def running_redis():
    """A throwaway `redis-server` on a free loopback port (no persistence);
    yields `(url, process)`. Skips the test where Redis is not installed
    (scripts/test.sh installs Debian's redis-server)."""
    import shutil

    redis_bin = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(redis_bin).exists():
        pytest.skip("redis-server is not installed (scripts/test.sh installs it)")
    port = _free_port()
    proc = subprocess.Popen(
        [redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError):
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def running_server(model: Path, pull: str, extra: tuple[str, ...] = ()):
    """Starts `tern serve --model MODEL` (pulling `pull` from the registry when
    the file is missing) on a free localhost port with API key `test-key`,
    yields its base URL once `GET /health` answers 200, and stops it."""
    with running_server_proc(model, pull, extra) as (url, _proc):
        yield url


@contextlib.contextmanager
def running_server_proc(model: Path, pull: str, extra: tuple[str, ...] = ()):
    """[`running_server`], yielding `(url, process)` for tests that kill it."""
    if not BINARY.exists():
        pytest.fail(f"{BINARY} is missing: run `cargo build --release` first")
    if not (ROOT / model).exists():
        subprocess.run([str(BINARY), "pull", pull], cwd=ROOT, check=True)
    port = _free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="tern-openai-"))
    log_path = log_dir / "serve.log"
    cmd = [
        str(BINARY), "serve",
        "--model", str(model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--api-key", API_KEY,
        *extra,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"tern serve exited with {proc.returncode}:\n{_log_tail(log_path)}")
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"tern serve not healthy after {STARTUP_TIMEOUT_S:.0f} s:\n{_log_tail(log_path)}")
            time.sleep(0.25)
        yield url, proc
    finally:
        _stop(proc)
        if os.environ.get("TERN_TEST_SHOW_LOG"):
            print(_log_tail(log_path))


@pytest.fixture(scope="session")
def server_url():
    """Base URL (`http://127.0.0.1:PORT`) of a `tern serve` running the real model."""
    with running_server(MODEL, "smollm2-135m-instruct", ("--kv-memory", "2GiB")) as url:
        yield url


@pytest.fixture(scope="session")
def client(server_url) -> openai.OpenAI:
    """The official SDK pointed at the server (no retries: failures show as they are)."""
    c = openai.OpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0, timeout=120.0)
    yield c
    c.close()


@pytest.fixture(scope="session")
def model_id(client) -> str:
    """The id the server serves, as `/v1/models` reports it."""
    models = client.models.list().data
    assert models, "GET /v1/models listed no model"
    return models[0].id


@pytest.fixture(scope="session")
def http(server_url):
    """A raw HTTP client with the API key, for requests the SDK would not send."""
    with httpx.Client(
        base_url=server_url,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=120.0,
    ) as c:
        yield c


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {"name" or "name{labels}": value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


@pytest.fixture(scope="session")
def metrics(server_url):
    """A function returning the server's current `/metrics` as a dict (the
    server has a key, so `/metrics` needs it too)."""

    def read() -> dict[str, float]:
        r = httpx.get(f"{server_url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10.0)
        assert r.status_code == 200, r.text
        return parse_metrics(r.text)

    return read
