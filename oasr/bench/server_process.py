"""A real ``oasr serve`` in a subprocess for the benches that load it over the network: started with the
arguments given, waited for until /health answers, stopped with SIGINT (as Ctrl-C would) when the block ends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

STOP_TIMEOUT_S = 60.0


def free_port() -> int:
    """A loopback port free now (another process may take it before the server binds it; rare enough here)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(*serve_args: str) -> list[str]:
    """The command line of ``oasr serve`` with ``serve_args``, in this interpreter."""
    return [sys.executable, "-m", "oasr.cli", "serve", *serve_args]


@contextlib.contextmanager
def running_server(command: list[str], url: str, log_path: Path, *, env: dict[str, str] | None = None,
                   timeout_s: float = 900) -> Iterator[subprocess.Popen]:
    """The server of ``command`` (its output to ``log_path``), healthy at ``url``, for the block's life."""
    with log_path.open("w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                  env=os.environ.copy() if env is None else env)
    try:
        wait_healthy(url, server, log_path, timeout_s)
        yield server
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def wait_healthy(url: str, process: subprocess.Popen, log_path: Path, timeout_s: float = 900) -> None:
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}; its log:\n{tail(log_path)}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server did not become healthy; its log:\n{tail(log_path)}")


def tail(path: Path, num_chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-num_chars:] if path.exists() else ""
