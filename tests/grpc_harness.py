"""What the gRPC tests share: a real ``oasr serve --grpc-port`` in a subprocess, and NVIDIA's Riva client run in
the Riva venv (``tests/riva_client.py``, see there) against it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

import oasr
from serving_harness import WAIT_S, wait_until

ROOT = Path(__file__).resolve().parents[1]
RIVA_PYTHON = Path(os.environ.get("OASR_RIVA_VENV", ROOT / ".venv-riva")) / "bin" / "python"
RIVA_CLIENT = Path(__file__).with_name("riva_client.py")
API_KEY = "grpc-test-key"


def require_riva_client() -> None:
    """Skips (fails in CI, where scripts/setup.sh makes it) without the Riva venv."""
    if RIVA_PYTHON.is_file():
        return
    reason = f"the Riva client venv is missing ({RIVA_PYTHON}); scripts/setup.sh makes it"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class GrpcServer:
    url: str  # HTTP
    uri: str  # gRPC, host:port as Riva clients take it

    def riva(self, command: str, timeout_s: float = WAIT_S, **args) -> dict:
        """One run of the Riva client; its JSON answer."""
        request = {"command": command, "uri": self.uri, "key": API_KEY, **args}
        done = subprocess.run([str(RIVA_PYTHON), str(RIVA_CLIENT), json.dumps(request)], capture_output=True,
                              text=True, timeout=timeout_s)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@contextmanager
def grpc_server(model: str, *extra: str) -> Iterator[GrpcServer]:
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(oasr.__file__).parent.parent), *sys.path]),
           "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "oasr.cli", "serve", "--model", model, "--device", "cpu",
                                "--dtype", "float32", "--port", str(port), "--grpc-port", str(grpc_port),
                                "--api-key", API_KEY, *extra], env=env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, "oasr serve exited"
        try:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, "oasr serve to start")
        yield GrpcServer(url, f"127.0.0.1:{grpc_port}")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def http_transcript(server: GrpcServer, audio: bytes, **fields) -> dict:
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", files={"file": ("clip.wav", audio)},
                          data={"model": "whisper-1", **fields}, headers={"Authorization": f"Bearer {API_KEY}"},
                          timeout=WAIT_S)
    assert response.status_code == 200, response.text
    return response.json()


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
