"""``oasr serve`` with its engine core in another process: what happens when that process dies, fails to
start or is shut down, and the batch sizes it reports. Each test starts its own core (a few seconds)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

import oasr
from oasr.bench.server_process import free_port, serve_command, wait_healthy
from oasr.cli import main
from oasr.hosting.relay import EngineDeadError
from oasr.engine.config import SchedulerConfig
from oasr.hosting.mp import MPClient
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from oasr.types import DecodeOptions
from serving_harness import WAIT_S, SlowEngine, metrics, running_server, small_engine, wait_until

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
PROMPT_FAILURE_S = 15  # a dead core is noticed at once; this only allows for a busy 2-core machine


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)


def transcribe(url: str, **kwargs):
    return client(url).audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="tiny.en", **kwargs)


def test_killed_core_answers_eight_in_flight_requests_then_comes_back():
    engine = small_engine("tiny.en")
    try:
        assert isinstance(engine, MPClient) and engine.pid != os.getpid()
        assert engine.info.core_class == "oasr.hosting.core.EngineCore"  # the class the thread and Ray hosts run
        slow = SlowEngine(engine)  # 400 tokens a window: every request is surely still decoding or queued at the kill
        with running_server(build_app(slow, ServerSettings(served_model_name="tiny.en"))) as url, \
                ThreadPoolExecutor(7) as pool:
            assert httpx.get(f"{url}/health").json()["status"] == "ok"
            stream = transcribe(url, stream=True)
            events = iter(stream)
            assert next(events).type == "transcript.text.delta"
            plain = [pool.submit(transcribe, url) for _ in range(7)]
            wait_until(lambda: in_engine(url) == 8, "all eight requests to reach the engine")
            killed = engine.pid
            os.kill(killed, signal.SIGKILL)
            killed_at = time.monotonic()
            for future in plain:  # each gets an answer: its text, or 503 naming the stopped engine
                try:
                    assert future.result(timeout=WAIT_S).text
                except openai.APIStatusError as error:
                    assert error.status_code == 503 and error.body["code"] == "engine_unavailable"
            assert time.monotonic() - killed_at < PROMPT_FAILURE_S
            with pytest.raises(openai.APIError) as info:  # the stream had started: its last event is the error
                for _ in events:
                    pass
            assert "The engine has stopped" in info.value.message
            assert slow.num_finished == 0
            # A new core is started: /health says so until it has loaded the model, then serves again.
            wait_until(lambda: httpx.get(f"{url}/health").json()["status"] == "ok", "the new core to serve",
                       timeout_s=60)
            assert engine.pid != killed and metrics(url)["oasr_engine_restarts_total"] == 1
            assert metrics(url)["oasr_engine_up"] == 1
            assert transcribe(url).text
    finally:
        engine.shutdown()


def in_engine(url: str) -> float:
    values = metrics(url)
    return values["oasr_engine_requests_running"] + values["oasr_engine_requests_waiting"]


def test_core_death_while_idle_shows_in_health_without_a_request():
    engine = small_engine("tiny.en")
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="tiny.en"))) as url:
            assert transcribe(url).text
            os.kill(engine.pid, signal.SIGKILL)
            wait_until(lambda: httpx.get(f"{url}/health").status_code == 503, "/health to see the dead core",
                       timeout_s=PROMPT_FAILURE_S)
    finally:
        engine.shutdown()


def test_metrics_report_the_engine_batch_sizes():
    engine = small_engine("tiny.en")
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="tiny.en"))) as url:
            before = metrics(url)
            assert before["oasr_engine_encode_batch_size_count"] == before["oasr_engine_decode_batch_size_count"] == 0
            assert before["oasr_engine_up"] == 1
            tokens = [t for s in transcribe(url, response_format="verbose_json").segments for t in s.tokens]
            values = metrics(url)
            # One request alone: one encode step of one row, then decode ticks of one row each.
            assert values["oasr_engine_encode_batch_size_count"] == values["oasr_engine_encode_batch_size_sum"] == 1
            assert values['oasr_engine_encode_batch_size_bucket{le="1.0"}'] == 1
            decode_steps = values["oasr_engine_decode_batch_size_count"]
            assert values["oasr_engine_decode_batch_size_sum"] == decode_steps
            assert values['oasr_engine_decode_batch_size_bucket{le="+Inf"}'] == decode_steps
            # The encode step yields the first token; each decode tick 4 more (end-of-text, not in ``tokens``,
            # among them): decode_steps_per_tick of the default scheduler config.
            assert decode_steps == -(-len(tokens) // SchedulerConfig().decode_steps_per_tick)
    finally:
        engine.shutdown()


def test_shutdown_stops_the_core_and_fails_what_was_waiting():
    engine = small_engine("tiny.en")
    process, sockets = engine._sockets.process, Path(engine._directory)
    assert (sockets / "input").exists()
    engine.shutdown()
    assert not process.is_alive() and process.exitcode == 0  # it was asked, not killed
    assert not sockets.exists()
    assert not engine.alive
    with pytest.raises(EngineDeadError):
        asyncio.run(engine.check(DecodeOptions(language="fr")))
    engine.shutdown()  # twice is harmless


def descendants(pid: int) -> set[int]:
    """The processes below ``pid``, read from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # it ended while we read
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


@pytest.mark.parametrize("workers", [[], ["--api-workers", "2"]], ids=["one-process", "api-workers"])
def test_killed_front_end_leaves_no_process_and_no_temp_directory(tmp_path, workers):
    temp = tmp_path / "tmp"
    temp.mkdir()
    url = f"http://127.0.0.1:{free_port()}"
    command = serve_command("--model", "tiny.en", "--device", "cpu", "--port", url.rsplit(":", 1)[1], *workers)
    env = {**os.environ, "TMPDIR": str(temp), "OMP_NUM_THREADS": "1"}
    with (tmp_path / "serve.log").open("w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    children: set[int] = set()
    try:
        wait_healthy(url, server, tmp_path / "serve.log", timeout_s=WAIT_S)
        assert transcribe(url).text
        children = descendants(server.pid)
        assert children and any(p.name.startswith("oasr-") for p in temp.iterdir())  # the core's sockets, metrics
        server.kill()
        server.wait()
        wait_until(lambda: not any(running(pid) for pid in children), "the front end's children to stop",
                   timeout_s=PROMPT_FAILURE_S)
        wait_until(lambda: not any(temp.iterdir()), "the temp directories to be removed", timeout_s=PROMPT_FAILURE_S)
    finally:
        if server.poll() is None:
            server.kill()
        for pid in filter(running, children | descendants(server.pid)):
            os.kill(pid, signal.SIGKILL)


def test_serve_with_a_bad_model_exits_with_a_clear_error(capsys):
    assert main(["serve", "--model", "no-such-model", "--device", "cpu", "--port", "0"]) == 2
    error = capsys.readouterr().err
    assert "oasr: error: the engine could not start no-such-model" in error
    assert "neither a model directory nor a known model name" in error


def test_thread_mode_serves_the_same_text_and_reports_batch_sizes(tiny_en):
    engine = small_engine("tiny.en", mode="thread")
    try:
        assert not isinstance(engine, MPClient)
        assert engine.info.core_class == "oasr.hosting.core.EngineCore"  # the class the process and Ray hosts run
        with running_server(build_app(engine, ServerSettings(served_model_name="tiny.en"))) as url:
            assert transcribe(url).text == oasr.transcribe(JFK, model=tiny_en)[0].text
            values = metrics(url)
            assert values["oasr_engine_encode_batch_size_sum"] == 1 and values["oasr_engine_up"] == 1
            assert values["oasr_engine_decode_batch_size_count"] > 0
    finally:
        engine.shutdown()
