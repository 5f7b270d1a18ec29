"""Whole-file uploads kept going beside a measured load (``oasr bench realtime --bulk-uploads N``): the bulk work a
live turn must not queue behind (issue 41: a turn's final pass scheduled ahead of files). Each of N clients posts
one long WAV to ``/v1/audio/transcriptions`` again and again until the measured load ends, then finishes the
upload it has in flight, so every count is of whole answers and no request is cut."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
import numpy as np
import soundfile as sf

from oasr.bench.realtime_client import ENGINE_RATE
from oasr.bench.serve_load import percentiles

T = TypeVar("T")


@dataclass
class BulkRecord:
    latencies_s: list[float] = field(default_factory=list)  # each answered upload's post -> answer
    errors: list[str] = field(default_factory=list)

    def summary(self, num_clients: int, audio_s: float) -> dict:
        return {"clients": num_clients, "upload_audio_s": round(audio_s, 3), "completed": len(self.latencies_s),
                "failed": len(self.errors), "first_errors": self.errors[:5],
                "latency_s": percentiles(self.latencies_s)}


def bulk_wav(clips: Sequence[np.ndarray], seconds: float) -> bytes:
    """16 kHz clips repeated in turn to ``seconds`` of audio, as one 16-bit WAV."""
    need = int(seconds * ENGINE_RATE)
    joined = np.concatenate(list(clips) * (need // max(sum(len(c) for c in clips), 1) + 1))[:need]
    out = io.BytesIO()
    sf.write(out, joined, ENGINE_RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


async def _client(url: str, wav: bytes, record: BulkRecord, stop: asyncio.Event) -> None:
    """Uploads until ``stop``; a failed upload is recorded and ends this client (a server that refuses or is
    gone would otherwise be asked again at once, as fast as it can answer, until the load ends)."""
    async with httpx.AsyncClient(timeout=None) as http:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                response = await http.post(f"{url}/v1/audio/transcriptions", files={"file": ("bulk.wav", wav)},
                                           data={"model": "whisper-1"})
            except httpx.HTTPError as exc:
                record.errors.append(f"{type(exc).__name__}: {exc}")
                return
            if response.status_code != 200:
                record.errors.append(f"{response.status_code}: {response.text[:200]}")
                return
            record.latencies_s.append(time.perf_counter() - start)


async def beside_bulk(load: Awaitable[T], url: str, wav: bytes, num_clients: int) -> tuple[T, BulkRecord]:
    """``load``'s result with ``num_clients`` uploading ``wav`` until it is done (each client's upload in flight
    then is waited for)."""
    record, stop = BulkRecord(), asyncio.Event()
    clients = [asyncio.create_task(_client(url, wav, record, stop)) for _ in range(num_clients)]
    try:
        result = await load
    finally:
        stop.set()
        await asyncio.gather(*clients)
    return result, record
