"""What ``oasr serve`` tells its user and its load balancer: the banner once it listens, an access line per
request (text or JSON), and /health's state (starting, ok, draining, dead) with the model and version."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

import oasr
from oasr.serving.app import ServingServer, build_app
from oasr.serving.connections import uvicorn_config
from oasr.serving.lifecycle import ServerState
from oasr.serving.server_log import SERVER_LOG, AccessRecord, Banner, ServerLogFormatter
from oasr.serving.settings import ServerSettings
from serving_harness import WAIT_S, _WrappedEngine, running_server, small_engine, wait_until

SETTINGS = ServerSettings(served_model_name="tiny.en", allowed_hosts=("127.0.0.1",))


@pytest.fixture(scope="module")
def engine():
    engine = small_engine("tiny.en", mode="thread")
    yield engine
    engine.shutdown()


class StatedEngine(_WrappedEngine):
    """The real engine, reporting a state of its own (as a client of a core it restarts would)."""

    def __init__(self, engine, state: str) -> None:
        super().__init__(engine)
        self._state = state

    @property
    def state(self) -> str:
        return self._state


def _health(url: str) -> tuple[int, dict]:
    response = httpx.get(f"{url}/health", timeout=WAIT_S)
    return response.status_code, response.json()


def test_health_names_the_model_version_and_state_and_is_200_only_when_ok(engine) -> None:
    app = build_app(engine, SETTINGS)
    with running_server(app) as url:
        assert _health(url) == (200, {"status": "ok", "model": "tiny.en", "version": oasr.__version__})
        app.state.lifecycle.drain()
        assert _health(url) == (503, {"status": "draining", "model": "tiny.en", "version": oasr.__version__})
    for reported, expected in (("starting", "starting"), ("dead", "dead"), ("ok", "ok")):
        with running_server(build_app(StatedEngine(engine, reported), SETTINGS)) as url:
            status, body = _health(url)
            assert (status, body["status"]) == (200 if expected == "ok" else 503, expected)


def test_the_server_drains_when_it_starts_stopping_and_greets_once_it_listens(engine) -> None:
    app = build_app(engine, SETTINGS)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    greeted = []
    server = ServingServer(uvicorn_config(app, SETTINGS, log_level="warning", lifespan="off"),
                           app.state.lifecycle, on_started=lambda: greeted.append(server.started))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "the server to start")
        assert greeted == [True] and app.state.lifecycle.state is ServerState.OK
        server.should_exit = True
        thread.join(timeout=WAIT_S)
        assert app.state.lifecycle.state is ServerState.DRAINING
    finally:
        server.should_exit = True
        sock.close()


def test_each_request_is_logged_with_method_path_status_duration_and_client(engine, caplog) -> None:
    caplog.set_level(logging.INFO, logger=SERVER_LOG)
    with running_server(build_app(engine, SETTINGS)) as url:
        httpx.get(f"{url}/health?secret=1", timeout=WAIT_S)
        httpx.get(f"{url}/nowhere", timeout=WAIT_S)
        httpx.get(f"{url}/health", headers={"Host": "evil.example"}, timeout=WAIT_S)  # refused by its Host
    records = [r.access for r in caplog.records if r.name == SERVER_LOG and hasattr(r, "access")]
    assert [(r.client, r.method, r.path, r.status) for r in records] == [
        ("127.0.0.1", "GET", "/health", 200), ("127.0.0.1", "GET", "/nowhere", 404),
        ("127.0.0.1", "GET", "/health", 400)]
    assert all(0 <= r.duration_ms < WAIT_S * 1000 for r in records)


def _record(**extra) -> logging.LogRecord:
    record = logging.LogRecord(SERVER_LOG, logging.INFO, __file__, 1, "message", None, None)
    record.__dict__.update(extra)
    return record


def test_access_lines_and_the_banner_read_as_text_or_as_one_json_object_each() -> None:
    access = AccessRecord("10.0.0.7", "POST", "/v1/audio/transcriptions", 200, 812.4)
    banner = Banner("tiny.en", "cuda:0", "engine in a process", "http://0.0.0.0:8000")
    text = ServerLogFormatter("text")
    assert text.format(_record(access=access)).endswith(' 10.0.0.7 "POST /v1/audio/transcriptions" 200 812 ms')
    shown = text.format(_record(banner=banner))
    assert shown.startswith("oasr serve: tiny.en on cuda:0 (engine in a process) is ready at http://0.0.0.0:8000")
    assert "ws://0.0.0.0:8000/v1/realtime?intent=transcription" in shown and "/metrics" in shown
    as_json = ServerLogFormatter("json")
    line = json.loads(as_json.format(_record(access=access)))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", line["time"])  # UTC, marked
    assert line | {"time": "-"} == {"time": "-", "event": "request", "client": "10.0.0.7", "method": "POST",
                                    "path": "/v1/audio/transcriptions", "status": 200, "duration_ms": 812.4}
    ready = json.loads(as_json.format(_record(banner=banner)))
    assert ready["event"] == "ready" and ready["device"] == "cuda:0"
    assert ready["routes"]["/v1/audio/transcriptions"] == "http://0.0.0.0:8000/v1/audio/transcriptions"


def test_oasr_serve_prints_its_banner_and_access_log_without_verbose() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "oasr.cli", "serve", "--device", "cpu", "--dtype", "float32", "--engine-mode",
               "thread", "--port", str(port)]
    server = subprocess.Popen(command, cwd=Path(oasr.__file__).parents[1], stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        lines = []
        while not lines or not lines[-1].startswith("Press Ctrl-C"):  # the banner's last line
            line = server.stderr.readline()
            assert line, f"oasr serve exited before its banner: {''.join(lines)}"
            lines.append(line)
        banner = "".join(lines)
        assert f"tiny.en on cpu (engine in a thread) is ready at http://127.0.0.1:{port}" in banner
        assert f"POST http://127.0.0.1:{port}/v1/audio/transcriptions" in banner
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=WAIT_S).status_code == 200
        assert re.fullmatch(r'\S+ 127\.0\.0\.1 "GET /health" 200 \d+ ms', server.stderr.readline().rstrip())
        server.send_signal(signal.SIGTERM)
        _, rest = server.communicate(timeout=WAIT_S)
        assert server.returncode == 0 and "Traceback" not in rest
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
