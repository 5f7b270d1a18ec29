"""``oasr serve --api-workers N``: several HTTP workers on one engine core. First the workers' clients in this
process (two apps attached to one shared core: text, disconnects, core death), then the real thing in a
subprocess (spread over workers, summed metrics, clean shutdown)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import oasr
from oasr.hosting.mp import MPClient, SharedEngineCore
from oasr.hosting.protocol import EngineCoreSpec
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from serving_harness import SMALL_ENGINE, WAIT_S, SlowEngine, metrics, running_server, wait_until

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
SETTINGS = ServerSettings(served_model_name="tiny.en")
SPEC = EngineCoreSpec("tiny.en", "cpu", "float32", SMALL_ENGINE, cpu_threads=1)


@pytest.fixture(scope="module")
def offline_text(tiny_en) -> str:
    return oasr.transcribe([JFK], model=tiny_en)[0].text


async def _post_all(urls: list[str], num_requests: int, **form) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=WAIT_S) as http:
        return await asyncio.gather(*(
            http.post(f"{urls[i % len(urls)]}/v1/audio/transcriptions",
                      files={"file": (JFK.name, JFK.read_bytes())}, data={"model": "tiny.en", **form})
            for i in range(num_requests)))


def test_two_attached_clients_share_one_core_abort_and_see_its_death(offline_text):
    core = SharedEngineCore(SPEC, 2)
    clients = [MPClient.attach(SPEC, channel, core.pid, i) for i, channel in enumerate(core.channels)]
    try:
        slow = SlowEngine(clients[1])
        with running_server(build_app(clients[0], SETTINGS)) as url0, \
                running_server(build_app(slow, SETTINGS)) as url1:
            fast = asyncio.run(_post_all([url0], 6))
            assert [(r.status_code, r.json()["text"]) for r in fast] == [(200, offline_text)] * 6

            # A client leaving worker 1 mid-decode aborts its request in the shared core: its rows free up.
            with httpx.Client(timeout=WAIT_S) as http, \
                    http.stream("POST", f"{url1}/v1/audio/transcriptions", files={"file": (JFK.name, JFK.read_bytes())},
                                data={"model": "tiny.en", "stream": "true"}) as response:
                next(response.iter_lines())  # a token was streamed: the request is decoding, 400 tokens to go
            wait_until(lambda: slow.num_closed_early == 1, "the disconnect to abort the request")
            assert slow.num_finished == 0
            wait_until(lambda: clients[0].stats().kv_blocks_used == 0 and clients[0].stats().num_running == 0,
                       "worker 0 to see the rows freed")
            assert metrics(url0)["oasr_engine_kv_blocks_used"] == 0

            os.kill(core.pid, signal.SIGKILL)
            core.process.join()  # the main process reaps it; the workers watch its process id
            for url in (url0, url1):
                wait_until(lambda url=url: httpx.get(f"{url}/health").status_code == 503, "/health to see the death")
                dead = asyncio.run(_post_all([url], 2))
                assert [(r.status_code, r.json()["error"]["code"]) for r in dead] == [(503, "engine_unavailable")] * 2
    finally:
        for client in clients:
            client.shutdown()
        core.stop()


_SERVE = """
import sys
from oasr.serving.app import ServingServer, build_app
from oasr.serving.settings import ServerSettings
from oasr.serving.workers import serve_workers
from serving_harness import SMALL_ENGINE
serve_workers("tiny.en", ServerSettings(served_model_name="tiny.en"), host="127.0.0.1", port=int(sys.argv[1]),
              api_workers=2, device="cpu", dtype="float32", config=SMALL_ENGINE, cpu_threads=1,
              build_app=build_app, server_class=ServingServer)
"""


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except FileNotFoundError:
        return set()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_with_two_workers_spreads_requests_sums_metrics_and_stops_cleanly(offline_text):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    server = subprocess.Popen([sys.executable, "-c", _SERVE, str(port)], env=env)
    try:
        answered: set[str] = set()

        def both_healthy() -> bool:  # each /health call is a new connection, hashed to one of the listening workers
            try:
                response = httpx.get(f"{url}/health", timeout=5)
            except httpx.HTTPError:
                return False
            if response.status_code == 200:
                answered.add(response.headers["x-oasr-api-worker"])
            return answered == {"0", "1"}

        wait_until(both_healthy, "both workers to start")
        processes = _children(server.pid)
        tracker = {p for p in processes if b"resource_tracker" in Path(f"/proc/{p}/cmdline").read_bytes()}
        assert len(processes - tracker) == 3  # the engine core and two workers (and multiprocessing's tracker)
        responses = asyncio.run(_post_all([url], 24))
        assert [(r.status_code, r.json()["text"]) for r in responses] == [(200, offline_text)] * 24
        workers = {r.headers["x-oasr-api-worker"] for r in responses}
        assert workers == {"0", "1"}, "24 concurrent connections should reach both workers"
        m = metrics(url)  # every worker's counts, summed, whichever worker answers the scrape
        assert m['oasr_http_requests_total{route="/v1/audio/transcriptions",status="200"}'] == 24
        assert m["oasr_request_total_seconds_count"] == 24
        assert m["oasr_http_requests_in_flight"] == 0 and m["oasr_engine_kv_blocks_used"] == 0
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in processes if Path(f"/proc/{pid}").exists()], "no worker or core outlives it"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
