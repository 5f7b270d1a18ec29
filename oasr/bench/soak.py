"""Soak test of ``oasr serve``: many requests at a fixed concurrency with injected faults, and one SIGTERM and
restart of the server mid-run. Every normal answer must carry the offline text of its clip.

    python -m oasr.bench.soak --requests 2000 --concurrency 32 --fault-rate 0.2 --model tiny.en --device cpu

Faults (``oasr.bench.soak_faults``): corrupt, empty, oversize and lying-header uploads, clients that leave
mid-upload or mid-decode, and slow clients that trickle their body. Beside them, ``--realtime-rounds`` rounds of
the realtime and request-head faults (``oasr.bench.soak_realtime``: deep JSON, commit floods, a session hog, a
header bomb), each expecting the answer the server's limits promise. Each request ends as one of:

- completed: a 200 answer;
- refused: an error status (counted per code); an oversize upload must be answered 413 too, not reset;
- refused_by_restart: an error status for a clip, or a transport error (refused, reset, closed without an
  answer), for a request in flight while the planned restart had the server stopping or away;
- abandoned: a client that left on purpose (the disconnect faults);
- lost: the server closed the connection without an answer, or could not be reached, outside the restart;
- hung: no answer within ``--timeout-s``.

The server's memory is sampled throughout; the summary gives its RSS in each quarter of the run (median and
peak), to show it flat. The exit status is 1 when any request or fault was lost or hung, or a normal answer's
text differs from
``oasr.transcribe`` on the same clip (computed once per clip); the JSON summary and a table are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

import oasr
from oasr.bench.soak_faults import (
    DISCONNECT_DECODE_MAX_S,
    FAULT_KINDS,
    TEXT_KINDS,
    Upload,
    fault_file,
    half_then_stall,
    multipart,
    trickled,
    whole,
)
from oasr.bench.soak_realtime import REALTIME_FAULTS, FaultOutcome, run_fault, summarize_faults
from oasr.bench.soak_server import ServerOptions, SoakServer, free_port
from oasr.devices import DEVICE_HELP, device_name

DEFAULT_CLIP = Path(oasr.__file__).parent / "assets" / "jfk.flac"
OUTCOMES = ("completed", "refused", "refused_by_restart", "abandoned", "lost", "hung")


@dataclass(frozen=True)
class SoakConfig:
    model: str
    device: str
    num_requests: int
    concurrency: int
    fault_rate: float
    timeout_s: float
    max_upload_mb: float
    clips: tuple[Path, ...]
    restart: bool = True
    seed: int = 0
    deadline_s: float | None = None  # no request is sent after this many seconds (those in flight finish)
    realtime_rounds: int = 1  # rounds of the realtime and request-head faults (each kind once a round)

    def __post_init__(self) -> None:
        if self.realtime_rounds < 0:
            raise ValueError(f"--realtime-rounds must be >= 0, got {self.realtime_rounds}")
        if self.num_requests < 1 or self.concurrency < 1:
            raise ValueError("--requests and --concurrency must be >= 1")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError(f"--fault-rate must be within [0, 1], got {self.fault_rate}")
        if not self.clips:
            raise ValueError("no clips to send")


@dataclass(frozen=True)
class Planned:
    index: int
    kind: str  # "normal" or one of FAULT_KINDS
    clip: int


@dataclass(frozen=True)
class Outcome:
    index: int
    kind: str
    clip: int
    outcome: str  # one of OUTCOMES
    status: int | None  # the HTTP status, when an answer came
    detail: str  # the status code, or the transport error's name and message
    text: str | None  # the answer's text (200 with a JSON body)
    started: float
    ended: float


@dataclass
class RestartWindow:
    """When the planned restart had the server away (monotonic seconds; ``end`` None while it is away)."""

    start: float | None = None
    end: float | None = None
    up: asyncio.Event = field(default_factory=asyncio.Event)

    def overlaps(self, started: float, ended: float) -> bool:
        if self.start is None:
            return False
        return started <= (self.end if self.end is not None else ended) and ended >= self.start


def plan(config: SoakConfig) -> list[Planned]:
    """``round(fault_rate * num_requests)`` faults at random places, their kinds dealt in turn (so that a
    short soak still has every kind), and the clips in turn."""
    rng = random.Random(config.seed)
    num_faults = round(config.fault_rate * config.num_requests)
    faults = {index: FAULT_KINDS[n % len(FAULT_KINDS)]
              for n, index in enumerate(sorted(rng.sample(range(config.num_requests), num_faults)))}
    return [Planned(i, faults.get(i, "normal"), i % len(config.clips)) for i in range(config.num_requests)]


async def _post(http: httpx.AsyncClient, url: str, item: Planned, upload: Upload,
                rng: random.Random) -> httpx.Response | None:
    """Sends one request as its kind's client would; None when the client left before the answer came."""
    endpoint, headers = f"{url}/v1/audio/transcriptions", {"content-type": upload.content_type}
    if item.kind == "slow":
        return await http.post(endpoint, content=trickled(upload.body), headers=headers)
    if item.kind not in ("disconnect_upload", "disconnect_decode"):
        return await http.post(endpoint, content=upload.body, headers=headers)
    sent = asyncio.Event()
    mid_upload = item.kind == "disconnect_upload"
    body = half_then_stall(upload.body, sent) if mid_upload else whole(upload.body, sent)
    request = asyncio.ensure_future(http.post(endpoint, content=body, headers=headers))
    waiter = asyncio.ensure_future(sent.wait())
    await asyncio.wait([request, waiter], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if not request.done():
        await asyncio.wait([request], timeout=0.05 if mid_upload else rng.uniform(0.05, DISCONNECT_DECODE_MAX_S))
    if request.done():
        return request.result()  # answered (or failed) before the client left
    request.cancel()
    try:
        await request
    except asyncio.CancelledError:
        pass
    return None


def _transport_outcome(exc: Exception, started: float, ended: float, window: RestartWindow) -> str:
    if isinstance(exc, (httpx.TimeoutException, asyncio.TimeoutError)):
        return "hung"
    if window.overlaps(started, ended):
        return "refused_by_restart"
    return "lost"


async def run_one(http: httpx.AsyncClient, url: str, item: Planned, upload: Upload, config: SoakConfig,
                  window: RestartWindow, rng: random.Random) -> Outcome:
    started = time.monotonic()
    status, text = None, None
    try:
        response = await asyncio.wait_for(_post(http, url, item, upload, rng), config.timeout_s)
    except (httpx.HTTPError, OSError, asyncio.TimeoutError) as exc:
        ended = time.monotonic()
        outcome = _transport_outcome(exc, started, ended, window)
        detail = f"{type(exc).__name__}: {exc}"[:200]
    else:
        ended = time.monotonic()
        if response is None:
            outcome, detail = "abandoned", "client left"
        else:
            status = response.status_code
            outcome, detail = ("completed" if status == 200 else "refused"), str(status)
            # A clip the server would answer, refused while the restart was under way: refused by the restart.
            if status != 200 and item.kind in TEXT_KINDS and window.overlaps(started, ended):
                outcome = "refused_by_restart"
            if status == 200:
                try:
                    text = response.json().get("text")
                except ValueError:
                    text = None
    return Outcome(item.index, item.kind, item.clip, outcome, status, detail, text, started, ended)


@dataclass
class SoakEvents:
    restart_s: float | None = None  # how long the planned restart had the server away
    unexpected_exits: int = 0  # server deaths the soak did not cause (it starts the server again)
    realtime: list[FaultOutcome] = field(default_factory=list)  # the realtime and request-head faults


def upload_for(item: Planned, clips: list[tuple[str, bytes]], config: SoakConfig, rng: random.Random) -> Upload:
    name, data = clips[item.clip]
    if item.kind != "normal":
        name, data = fault_file(item.kind, name, data, int(config.max_upload_mb * (1 << 20)), rng)
    return multipart(name, data, {"model": "whisper-1", "response_format": "json"})


async def soak(config: SoakConfig, server: SoakServer) -> tuple[list[Outcome], SoakEvents]:
    """Sends the planned requests from ``concurrency`` clients; the request half-way through the plan sets
    off the restart, and while the server is away clients wait before sending their next request."""
    clips = [(p.name, p.read_bytes()) for p in config.clips]
    todo = list(reversed(plan(config)))
    window, events, outcomes = RestartWindow(), SoakEvents(), []
    window.up.set()
    rng = random.Random(config.seed + 1)
    # Half-way through the plan, or half-way to the deadline when that comes first.
    restart_at = config.num_requests // 2 if config.restart else None
    began = time.monotonic()
    background: list[asyncio.Future] = []

    async def restart() -> None:
        window.start = time.monotonic()
        window.up.clear()
        try:
            events.restart_s = await server.restart()
        finally:
            window.end = time.monotonic()
            window.up.set()

    async def watch() -> None:
        while True:
            await asyncio.sleep(0.5)
            if window.up.is_set() and not server.alive():
                events.unexpected_exits += 1
                await server.start()

    stop_at = time.monotonic() + config.deadline_s if config.deadline_s is not None else float("inf")

    async def client(http: httpx.AsyncClient) -> None:
        while todo:
            await window.up.wait()
            if not todo or time.monotonic() > stop_at:
                return
            item = todo.pop()
            halfway = config.deadline_s is not None and time.monotonic() - began > config.deadline_s / 2
            if restart_at is not None and not background and (item.index >= restart_at or halfway):
                background.append(asyncio.ensure_future(restart()))
            upload = upload_for(item, clips, config, rng)
            outcomes.append(await run_one(http, server.url, item, upload, config, window, rng))

    async def realtime_faults() -> None:
        """The rounds one after another, spread over the run: one round per share of the requests sent."""
        for round_index in range(config.realtime_rounds):
            while len(outcomes) < round_index * config.num_requests // max(config.realtime_rounds, 1) and todo:
                await asyncio.sleep(0.1)
            for kind in REALTIME_FAULTS:
                await window.up.wait()
                if time.monotonic() > stop_at:
                    return
                started = time.monotonic()
                outcome, detail = await run_fault(kind, server.url, config.timeout_s)
                ended = time.monotonic()
                if outcome == "lost" and window.overlaps(started, ended):
                    outcome = "refused_by_restart"
                events.realtime.append(FaultOutcome(kind, outcome, detail, started, ended))

    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=0)
    watcher, sampler = asyncio.ensure_future(watch()), asyncio.ensure_future(server.sample_memory())
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s), limits=limits) as http:
            await asyncio.gather(realtime_faults(), *(client(http) for _ in range(config.concurrency)))
        await asyncio.gather(*background)
    finally:
        watcher.cancel()
        sampler.cancel()
    return sorted(outcomes, key=lambda o: o.index), events


def _reasons(outcomes: list[Outcome], outcome: str) -> dict[str, int]:
    """How requests of one outcome ended: their status codes, or their transport errors' names."""
    reasons = Counter(str(o.status) if o.status is not None else o.detail.split(":")[0]
                      for o in outcomes if o.outcome == outcome)
    return dict(sorted(reasons.items()))


def _kind_rows(outcomes: list[Outcome]) -> dict[str, dict]:
    rows = {}
    for kind in ("normal", *FAULT_KINDS):
        mine = [o for o in outcomes if o.kind == kind]
        counts = Counter(o.outcome for o in mine)
        seconds = sorted(o.ended - o.started for o in mine)
        rows[kind] = {"sent": len(mine), **{k: counts.get(k, 0) for k in OUTCOMES},
                      "refused_by": _reasons(mine, "refused"), "restart_by": _reasons(mine, "refused_by_restart"),
                      "p50_s": round(seconds[len(seconds) // 2], 2) if seconds else None,
                      "max_s": round(seconds[-1], 2) if seconds else None}
    return rows


def summarize(config: SoakConfig, outcomes: list[Outcome], offline: dict[int, str], server: SoakServer,
              events: SoakEvents, healthy_at_end: bool, wall_s: float) -> dict:
    rows = _kind_rows(outcomes)
    totals = {k: sum(r[k] for r in rows.values()) for k in ("sent", *OUTCOMES)}
    checked = [o for o in outcomes if o.kind in TEXT_KINDS and o.status == 200]
    mismatches = [o for o in checked if o.text != offline[o.clip]]
    troubles = [o for o in outcomes if o.outcome in ("lost", "hung")]
    realtime = summarize_faults(events.realtime)
    realtime_troubles = [o for o in events.realtime if o.outcome in ("lost", "hung")]
    return {
        "config": {**{k: v for k, v in asdict(config).items() if k != "clips"},
                   "clips": [str(p) for p in config.clips]},
        "totals": totals,
        "by_kind": rows,
        "server_errors_5xx": sum(1 for o in outcomes if o.status is not None and o.status >= 500),
        "texts": {"checked": len(checked), "equal": len(checked) - len(mismatches),
                  "mismatches": [{"index": o.index, "clip": str(config.clips[o.clip]), "expected": offline[o.clip],
                                  "got": o.text} for o in mismatches[:5]]},
        "lost_or_hung": [{"index": o.index, "kind": o.kind, "outcome": o.outcome, "detail": o.detail}
                         for o in troubles[:10]],
        "realtime_faults": realtime,
        "realtime_lost_or_hung": [{"kind": o.kind, "outcome": o.outcome, "detail": o.detail}
                                  for o in realtime_troubles[:10]],
        "not_sent": config.num_requests - len(outcomes),
        "server": {"peak_rss_mib": round(server.peak_rss_bytes / (1 << 20), 1),
                   "peak_pss_mib": round(server.peak_pss_bytes / (1 << 20), 1),
                   "peak_pss_mib_by_process": {role: round(size / (1 << 20), 1)
                                               for role, size in sorted(server.peak_pss_by_role.items())},
                   "pss_breakdown_mib": {role: {name: round(size / (1 << 20), 1) for name, size in mappings}
                                         for role, (_, mappings) in sorted(server.peak_mappings_by_role.items())},
                   "rss_mib_by_quarter": server.rss_by_quarter(),
                   "restart_s": events.restart_s,
                   "unexpected_exits": events.unexpected_exits, "exit_codes": server.exit_codes,
                   "killed_after_sigterm": server.num_killed, "healthy_at_end": healthy_at_end},
        "wall_s": round(wall_s, 1),
        "ok": totals["lost"] == 0 and totals["hung"] == 0 and not mismatches and not realtime_troubles,
    }


def print_table(summary: dict, out=sys.stdout) -> None:
    header = ("kind", "sent", "done", "refused", "restart", "left", "lost", "hung", "p50 s", "max s", "refused by")
    out.write("{:<18}{:>6}{:>6}{:>9}{:>9}{:>6}{:>6}{:>6}{:>8}{:>8}  {}\n".format(*header))
    total = {**summary["totals"], "refused_by": {}, "restart_by": {}, "p50_s": None, "max_s": None}
    for kind, r in [*summary["by_kind"].items(), ("total", total)]:
        codes = ", ".join([*(f"{c} x{n}" for c, n in r["refused_by"].items()),
                           *(f"{c} x{n} (restart)" for c, n in r["restart_by"].items())])
        out.write(f"{kind:<18}{r['sent']:>6}{r['completed']:>6}{r['refused']:>9}{r['refused_by_restart']:>9}"
                  f"{r['abandoned']:>6}{r['lost']:>6}{r['hung']:>6}{r['p50_s']!s:>8}{r['max_s']!s:>8}  {codes}\n")
    t, s = summary["texts"], summary["server"]
    out.write(f"texts equal to offline: {t['equal']}/{t['checked']}; 5xx answers: {summary['server_errors_5xx']}; "
              f"server peak RSS {s['peak_rss_mib']} MiB (PSS {s['peak_pss_mib']} MiB); restart {s['restart_s']} s; "
              f"unexpected exits {s['unexpected_exits']}; healthy at end: {s['healthy_at_end']}\n")
    for kind, r in summary["realtime_faults"].items():
        out.write(f"realtime {kind:<14}sent {r['sent']}, handled {r['handled']}, restart "
                  f"{r['refused_by_restart']}, lost {r['lost']}, hung {r['hung']}: {'; '.join(r['details'][:2])}\n")
    quarters = s["rss_mib_by_quarter"]
    out.write("server RSS by quarter of the run (median / peak MiB): "
              + ", ".join(f"{q['median']} / {q['peak']}" for q in quarters) + "\n")
    if summary["not_sent"]:
        out.write(f"stopped at the deadline: {summary['not_sent']} requests not sent\n")
    num_troubles = len(summary["realtime_lost_or_hung"])
    out.write(f"{'OK' if summary['ok'] else 'FAILED'}: {summary['totals']['lost']} lost, "
              f"{summary['totals']['hung']} hung, {num_troubles} realtime faults lost or hung, "
              f"{t['checked'] - t['equal']} text mismatches in {summary['wall_s']} s\n")


def manifest_clips(manifest: Path, num_clips: int, max_bytes: int) -> tuple[Path, ...]:
    """Up to ``num_clips`` English clips of at most 30 s (one window) and half the upload limit, spread over
    the manifest."""
    rows = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
    paths = [manifest.parent / r["audio"] for r in rows
             if r.get("language") == "en" and r["duration_s"] <= 30 and "channel" not in r]
    paths = [p for p in paths if p.stat().st_size <= max_bytes // 2]
    step = max(len(paths) // max(num_clips, 1), 1)
    return tuple(paths[::step][:num_clips])


def offline_texts(config: SoakConfig) -> dict[int, str]:
    """``oasr.transcribe`` on each clip: the text every answer for that clip must equal."""
    results = oasr.transcribe([str(p) for p in config.clips], model=config.model, device=config.device)
    return {i: r.text for i, r in enumerate(results)}


async def run_soak(config: SoakConfig, log_path: Path) -> dict:
    offline = offline_texts(config)
    server = SoakServer(ServerOptions(config.model, config.device, free_port(), config.max_upload_mb, log_path))
    began = time.monotonic()
    await server.start()
    try:
        outcomes, events = await soak(config, server)
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                healthy = (await http.get(f"{server.url}/health")).status_code == 200
        except httpx.HTTPError:
            healthy = False
    finally:
        await server.stop()
    return summarize(config, outcomes, offline, server, events, healthy, time.monotonic() - began)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m oasr.bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--fault-rate", type=float, default=0.2, help="share of requests that are faults")
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--device", default="cpu", type=device_name, help=DEVICE_HELP)
    p.add_argument("--timeout-s", type=float, default=120.0, help="a request unanswered this long is hung")
    p.add_argument("--manifest", type=Path, default=None,
                   help="JSONL (audio, duration_s, language) to take the normal clips from (default: jfk.flac)")
    p.add_argument("--num-clips", type=int, default=8, help="clips taken from --manifest")
    p.add_argument("--max-upload-mb", type=float, default=4.0, help="the server's limit; oversize faults pass it")
    p.add_argument("--no-restart", action="store_true", help="no SIGTERM and restart of the server mid-run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline-s", type=float, default=None,
                   help="send no request after this many seconds; the summary counts the ones not sent")
    p.add_argument("--realtime-rounds", type=int, default=1,
                   help="rounds of the realtime and request-head faults (deep JSON, commit flood, session hog, "
                   "header bomb), spread over the run; 0: none")
    p.add_argument("--json-out", type=Path, default=None, help="also write the JSON summary here")
    p.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "oasr-soak-server.log",
                   help="the server's output")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    max_bytes = int(args.max_upload_mb * (1 << 20))
    clips = manifest_clips(args.manifest, args.num_clips, max_bytes) if args.manifest else (DEFAULT_CLIP,)
    try:
        config = SoakConfig(args.model, args.device, args.requests, args.concurrency, args.fault_rate,
                            args.timeout_s, args.max_upload_mb, clips, restart=not args.no_restart, seed=args.seed,
                            deadline_s=args.deadline_s, realtime_rounds=args.realtime_rounds)
    except ValueError as exc:
        print(f"soak: error: {exc}", file=sys.stderr)
        return 2
    args.log.write_text("")
    summary = asyncio.run(run_soak(config, args.log))
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n", encoding="utf-8")
    print_table(summary)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
