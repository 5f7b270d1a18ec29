"""What the gRPC tests share: a real ``oasr serve --grpc-port`` in a subprocess, and NVIDIA's Riva client run in
the Riva venv (``tests/riva_client.py``, see there) against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

import oasr
from oasr.bench.server_process import free_port, running_server, serve_command
from serving_harness import WAIT_S

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
    command = serve_command("--model", model, "--device", "cpu", "--dtype", "float32", "--port", str(port),
                            "--grpc-port", str(grpc_port), "--api-key", API_KEY, *extra)
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as logs, \
            running_server(command, url, Path(logs) / "serve.log", env=env, timeout_s=WAIT_S):
        yield GrpcServer(url, f"127.0.0.1:{grpc_port}")


def http_transcript(server: GrpcServer, audio: bytes, **fields) -> dict:
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", files={"file": ("clip.wav", audio)},
                          data={"model": "whisper-1", **fields}, headers={"Authorization": f"Bearer {API_KEY}"},
                          timeout=WAIT_S)
    assert response.status_code == 200, response.text
    return response.json()


def pcm16(samples: np.ndarray) -> bytes:
    """Float samples as 16-bit PCM, the inverse of the server's ``int16 / 32768``: samples that came from 16-bit
    PCM give back the same integers. (Scaling by 32767 and truncating, as this once did, moved most samples of a
    re-encoded clip by one step; the random streaming model's text changed with them.)"""
    return np.clip(np.round(samples * 32768), -32768, 32767).astype("<i2").tobytes()
