"""What the soak sends: multipart bodies for normal clips and for each injected fault, and the faulty clients.

A fault either sends a body the server must refuse (corrupt, empty, oversize, lying header) or behaves badly
as a client (leaves mid-upload, leaves mid-decode, trickles its body). Bodies are built by hand, not by
httpx's ``files=``, so that a client can stream them at its own pace and stop wherever it likes.
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass

REFUSED_BODIES = ("corrupt", "empty", "oversize", "lying_header")
BAD_CLIENTS = ("disconnect_upload", "disconnect_decode", "slow")
FAULT_KINDS = REFUSED_BODIES + BAD_CLIENTS
# Kinds whose clip is a normal one, answered (when answered) with the clip's text.
TEXT_KINDS = ("normal", "slow", "disconnect_decode")

_BOUNDARY = "oasr-soak-boundary-7d1c"
# The lying WAV: 4,000 PCM samples whose header claims 1 Hz, i.e. 4,000 s of audio (over the server's default
# 3,600 s limit) that a decoder resampling before it checks the length turns into 64 M samples (256 MB).
LYING_RATE_HZ = 1
LYING_NUM_SAMPLES = 4000
SLOW_NUM_CHUNKS = 40  # a slow client sends its body in this many pieces ...
SLOW_CHUNK_DELAY_S = 0.05  # ... this far apart (about 2 s for the body)
DISCONNECT_DECODE_MAX_S = 0.5  # a client that leaves mid-decode waits up to this long after its upload


@dataclass(frozen=True)
class Upload:
    """One request's body: ``content_type`` carries the multipart boundary."""

    content_type: str
    body: bytes


def multipart(filename: str, data: bytes, fields: dict[str, str]) -> Upload:
    parts = [
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    parts.append(f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    parts.append(f"--{_BOUNDARY}--\r\n".encode())
    return Upload(f"multipart/form-data; boundary={_BOUNDARY}", b"".join(parts))


def lying_wav(rng: random.Random) -> bytes:
    """A well-formed 16-bit mono WAV whose header claims ``LYING_RATE_HZ``."""
    pcm = struct.pack(f"<{LYING_NUM_SAMPLES}h", *(rng.randint(-3000, 3000) for _ in range(LYING_NUM_SAMPLES)))
    rate, block = LYING_RATE_HZ, 2
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * block, block, 16)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(pcm)) + pcm
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def fault_file(kind: str, clip_name: str, clip_bytes: bytes, max_upload_bytes: int,
               rng: random.Random) -> tuple[str, bytes]:
    """The (file name, file bytes) a body fault uploads; a bad client uploads the clip itself."""
    if kind == "corrupt":  # the clip's name and length, random contents
        return clip_name, rng.randbytes(len(clip_bytes))
    if kind == "empty":
        return clip_name, b""
    if kind == "oversize":  # a real clip followed by padding, just over the limit
        return clip_name, clip_bytes + bytes(max_upload_bytes + (1 << 16) - len(clip_bytes))
    if kind == "lying_header":
        return "lying.wav", lying_wav(rng)
    return clip_name, clip_bytes


async def whole(body: bytes, sent: asyncio.Event) -> AsyncIterator[bytes]:
    """The body in one piece; ``sent`` is set once the transport has taken it."""
    yield body
    sent.set()


async def trickled(body: bytes) -> AsyncIterator[bytes]:
    """A slow client: the body in ``SLOW_NUM_CHUNKS`` pieces, ``SLOW_CHUNK_DELAY_S`` apart."""
    step = max(len(body) // SLOW_NUM_CHUNKS, 1)
    for start in range(0, len(body), step):
        yield body[start : start + step]
        await asyncio.sleep(SLOW_CHUNK_DELAY_S)


async def half_then_stall(body: bytes, sent: asyncio.Event) -> AsyncIterator[bytes]:
    """A client that leaves mid-upload: half the body, then nothing (its request is cancelled once ``sent``)."""
    yield body[: len(body) // 2]
    sent.set()
    await asyncio.Event().wait()
    yield body[len(body) // 2 :]  # never reached: the request is cancelled while it waits
