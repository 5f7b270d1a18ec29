"""The soak's server: a real ``oasr serve`` subprocess on 127.0.0.1, stopped with SIGTERM and started again
on the same port, with the resident memory of its whole process tree (API process, engine core) sampled."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

import oasr

_STOP_WAIT_S = 60  # SIGTERM's graceful shutdown is 5 s; past this the server is killed (and that is reported)


@dataclass(frozen=True)
class ServerOptions:
    model: str
    device: str
    port: int
    max_upload_mb: float
    log_path: Path
    start_timeout_s: float = 600.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class TreeMemory:
    """Resident memory of a process tree: ``rss`` counts the pages the processes share (libtorch, say) once
    per process, so it errs high; ``pss`` shares each such page out among them, so it adds up."""

    rss_bytes: int
    pss_bytes: int
    pss_by_role: dict[str, int]  # "server" (the process started) and its children by what they run


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "server"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "child"
    text = b" ".join(command).decode(errors="replace")
    if "resource_tracker" in text:
        return "resource tracker"
    return "engine core or worker" if "spawn_main" in text else "child"


def _kib_field(path: Path, name: str) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1]) * 1024
    return 0


def mappings_by_pss(pid: int, top: int = 12) -> list[tuple[str, int]]:
    """The process's resident memory by what it maps (a library's path, ``[heap]``, ``[anon]``, a device file),
    largest first: where a process's PSS goes."""
    sizes: dict[str, int] = {}
    name = "[anon]"
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
            name = fields[5] if len(fields) > 5 else "[anon]"
        elif fields and fields[0] == "Pss:":
            sizes[name] = sizes.get(name, 0) + int(fields[1]) * 1024
    return sorted(sizes.items(), key=lambda item: -item[1])[:top]


def tree_memory(pid: int) -> TreeMemory:
    """Sums over ``pid`` and its descendants (Linux /proc); zeros once the processes are gone."""
    rss, pss, todo = 0, 0, [pid]
    by_role: dict[str, int] = {}
    while todo:
        current = todo.pop()
        try:
            rss += _kib_field(Path(f"/proc/{current}/status"), "VmRSS:")
            own = _kib_field(Path(f"/proc/{current}/smaps_rollup"), "Pss:")
            pss += own
            role = _role(current, pid)
            by_role[role] = by_role.get(role, 0) + own
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return TreeMemory(rss, pss, by_role)


class SoakServer:
    """One server at a time; ``restart()`` is a SIGTERM, a wait for the exit, and a fresh start."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.url = f"http://127.0.0.1:{options.port}"
        self.process: subprocess.Popen | None = None
        self.peak_rss_bytes = 0
        self.peak_pss_bytes = 0
        self.peak_pss_by_role: dict[str, int] = {}  # each role's own peak (not all at one instant)
        # What each role's largest PSS seen at a breakdown sample was made of (``mappings_by_pss``).
        self.peak_mappings_by_role: dict[str, tuple[int, list[tuple[str, int]]]] = {}
        self.exit_codes: list[int] = []
        self.num_killed = 0  # stops that SIGTERM did not finish within _STOP_WAIT_S
        self.rss_samples: list[int] = []  # every sample's RSS, in order (4 a second: small for hours)

    def command(self) -> list[str]:
        o = self.options
        return [sys.executable, "-m", "oasr.cli", "serve", "--model", o.model, "--device", o.device,
                "--host", "127.0.0.1", "--port", str(o.port), "--max-upload-mb", str(o.max_upload_mb)]

    async def start(self) -> float:
        """Starts the server and waits until /health answers 200; returns the seconds that took."""
        started = time.monotonic()
        env = dict(os.environ)
        # The server imports the same oasr as this harness, wherever the harness was started from.
        package_root = str(Path(oasr.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        with self.options.log_path.open("a") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        await self._wait_healthy()
        return time.monotonic() - started

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.options.start_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited with {self.process.returncode}: see {self.options.log_path}")
                try:
                    if (await http.get(f"{self.url}/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.25)
        raise RuntimeError(f"server not healthy after {self.options.start_timeout_s:g} s: see {self.options.log_path}")

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        deadline = time.monotonic() + _STOP_WAIT_S
        while process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if process.poll() is None:
            self.num_killed += 1
            process.kill()
            process.wait()
        self.exit_codes.append(process.returncode)

    async def restart(self) -> float:
        """SIGTERM, then start again on the same port; returns the seconds the server was away."""
        began = time.monotonic()
        await self.stop(signal.SIGTERM)
        await self.start()
        return time.monotonic() - began

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def sample_memory(self, interval_s: float = 0.25, breakdown_every: int = 20) -> None:
        """Runs until cancelled, keeping the peak RSS and PSS of whichever server process tree is up; every
        ``breakdown_every`` samples it also reads each process's mappings, keeping the largest per role."""
        samples = 0
        while True:
            if self.process is not None:
                memory = tree_memory(self.process.pid)
                self.peak_rss_bytes = max(self.peak_rss_bytes, memory.rss_bytes)
                self.rss_samples.append(memory.rss_bytes)
                self.peak_pss_bytes = max(self.peak_pss_bytes, memory.pss_bytes)
                for role, size in memory.pss_by_role.items():
                    self.peak_pss_by_role[role] = max(self.peak_pss_by_role.get(role, 0), size)
                samples += 1
                if samples % breakdown_every == 0:
                    self._sample_mappings(self.process.pid)
            await asyncio.sleep(interval_s)

    def rss_by_quarter(self) -> list[dict[str, float]]:
        """The RSS samples in four equal spans of the run: each span's median and peak in MiB (flat memory:
        the later medians no higher than the first by more than noise)."""
        samples, quarters = self.rss_samples, []
        for n in range(4):
            span = sorted(samples[n * len(samples) // 4 : (n + 1) * len(samples) // 4])
            if span:
                quarters.append({"median": round(span[len(span) // 2] / (1 << 20), 1),
                                 "peak": round(span[-1] / (1 << 20), 1)})
        return quarters

    def _sample_mappings(self, root: int) -> None:
        todo = [root]
        while todo:
            pid = todo.pop()
            try:
                own = _kib_field(Path(f"/proc/{pid}/smaps_rollup"), "Pss:")
                role = f"{_role(pid, root)} {pid}"
                if own > self.peak_mappings_by_role.get(role, (0, []))[0]:
                    self.peak_mappings_by_role[role] = (own, mappings_by_pss(pid))
                for task in Path(f"/proc/{pid}/task").iterdir():
                    todo.extend(int(c) for c in (task / "children").read_text().split())
            except (OSError, ValueError):
                continue
