"""End-to-end fixtures: a real `qwasi serve` (embedded demo model, bundled
guests) on 127.0.0.1, driven by the official `openai` client and raw HTTP.

Environment:
  QWASI_BIN                  the binary (default: target/debug/qwasi; build it
                             with `cargo build -p qwasi`)
  QWASI_E2E_START_TIMEOUT    seconds to wait for /ready (default 300: a debug
                             host compiles the guests on a cold start)
  QWASI_E2E_SERVER_ARGS      extra arguments for every `qwasi serve` (shell words)
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import openai
import pytest

REPO = Path(__file__).resolve().parents[2]

# API keys of the authenticated server (`--api-key`).
ALICE_KEY = "sk-alice-e2e-0123456789abcdef"
BOB_KEY = "sk-bob-e2e-fedcba9876543210"


def qwasi_bin() -> Path:
    p = Path(os.environ.get("QWASI_BIN", "target/debug/qwasi"))
    if not p.is_absolute():
        p = REPO / p
    return p


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `qwasi serve` process on a free 127.0.0.1 port."""

    def __init__(self, extra_args: list[str], name: str):
        self.extra_args = extra_args
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = Path(tempfile.mkdtemp(prefix=f"qwasi-e2e-{name}-")) / "server.log"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def start(self) -> "Server":
        binary = qwasi_bin()
        if not binary.exists():
            pytest.fail(
                f"qwasi binary not found at {binary}: build it with `cargo build -p qwasi` "
                "or point QWASI_BIN at it",
                pytrace=False,
            )
        timeout = float(os.environ.get("QWASI_E2E_START_TIMEOUT", "300"))
        extra = shlex.split(os.environ.get("QWASI_E2E_SERVER_ARGS", ""))
        # The free port can be taken between our probe and the server's bind:
        # retry a few times on an early exit.
        for attempt in range(3):
            self.port = free_port()
            cmd = [str(binary), "serve", "--host", self.host, "--port", str(self.port),
                   *self.extra_args, *extra]
            log = open(self.log_path, "ab")
            log.write(f"$ {shlex.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO
            )
            log.close()
            if self._wait_ready(timeout):
                return self
            if self.proc.poll() is not None and "cannot listen" in self.log_tail() and attempt < 2:
                continue
            self.stop()
            pytest.fail(
                f"qwasi serve ({self.name}) did not become ready within {timeout:.0f} s "
                f"(exit status {self.proc.returncode}); log {self.log_path}:\n{self.log_tail()}",
                pytrace=False,
            )
        raise AssertionError("unreachable")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                status, _, body = self.request("GET", "/ready", timeout=2)
                if status == 200 and json.loads(body).get("ready", True):
                    return True
            except (OSError, http.client.HTTPException, ValueError):
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def request(
        self,
        method: str,
        path: str,
        body: object | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """A raw HTTP request; `body` is sent as JSON (bytes/str as is)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            hdrs = dict(headers or {})
            data = None
            if body is not None:
                data = body if isinstance(body, (bytes, str)) else json.dumps(body)
                hdrs.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()
        finally:
            conn.close()

    def client(self, api_key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=120
        )


@pytest.fixture(scope="session")
def server():
    """The default server: no API key, bundled guests, demo model."""
    s = Server([], "open").start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def auth_server():
    """A server that requires an API key (two keys, one named)."""
    s = Server(["--api-key", f"alice:{ALICE_KEY}", "--api-key", BOB_KEY], "auth").start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="session")
def model_id(client) -> str:
    models = client.models.list().data
    assert len(models) == 1, models
    return models[0].id


_built_examples: dict[str, Path] = {}


def example_wasm(package: str, artifact: str) -> Path:
    """Builds an example guest of the guests workspace (examples/*) for
    wasm32-wasip2 and returns its component. One cargo invocation per package:
    features unify within an invocation, and each example enables the SDK
    feature of its own world (`api` or `policy`). A no-op when up to date."""
    if package not in _built_examples:
        cmd = ["cargo", "build", "--manifest-path", str(REPO / "guests/Cargo.toml"),
               "--target", "wasm32-wasip2", "--release", "--quiet", "-p", package]
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith("CARGO_") and k != "CARGO_HOME") and k != "RUSTFLAGS"}
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"{shlex.join(cmd)} failed:\n{r.stderr}", pytrace=False)
        wasm = REPO / "guests/target/wasm32-wasip2/release" / f"{artifact}.wasm"
        assert wasm.exists(), f"{shlex.join(cmd)} did not produce {wasm}"
        _built_examples[package] = wasm
    return _built_examples[package]
