"""Token-streaming partials of the speech LLMs (Voxtral, Qwen2-Audio) on ``/v1/realtime``: a committed turn's text
comes out as deltas while the model decodes it, more than one for a transcript of several tokens, and they join
into the completed transcript, which is what offline decoding gives. (Their SSE deltas are pinned in
tests/test_voxtral.py and tests/test_qwen2_audio.py.)"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import soxr
from openai import AsyncOpenAI

import oasr
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from serving_harness import WAIT_S, running_server, small_engine


def pcm16_24k(samples: np.ndarray) -> bytes:
    return (np.clip(soxr.resample(samples, 16_000, 24_000), -1, 1) * 32767).round().astype("<i2").tobytes()


def as_served(pcm: bytes) -> np.ndarray:
    return soxr.resample(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768, 24_000, 16_000)


def checkpoint(family: str, tmp_path_factory):
    """A tiny checkpoint of ``family`` whose transcripts of its clip end early (an extra end token), and the clip."""
    if family == "voxtral":
        import voxtral_reference as ref
        seconds = 3.1
    else:
        import qwen2_audio_reference as ref
        seconds = 2.3
    base = ref.make_checkpoint(tmp_path_factory.mktemp(family))
    (audio,) = ref.audio_batch((seconds,))
    row = ref.reference_generate(base, [audio], language="en")[0]
    stop = next(t for t in row[6:] if t not in row[:6])
    return ref.make_checkpoint(tmp_path_factory.mktemp(f"{family}_ending"), extra_end=stop), audio


@pytest.mark.parametrize("family", ["voxtral", "qwen2_audio"])
def test_realtime_turn_streams_token_deltas(family, tmp_path_factory) -> None:
    directory, audio = checkpoint(family, tmp_path_factory)
    pcm = pcm16_24k(audio)
    expected = oasr.transcribe([as_served(pcm)], model=str(directory), device="cpu", dtype="float32",
                               language="en")[0].text
    assert expected
    engine = small_engine(str(directory), mode="thread")

    async def session(url: str) -> list[dict]:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                             websocket_base_url=url.replace("http://", "ws://") + "/v1")
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            events = [json.loads(await asyncio.wait_for(conn.recv_bytes(), WAIT_S))]
            await conn.session.update(session={"type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 24_000}, "turn_detection": None,
                "transcription": {"model": family, "language": "en"}}}})
            events.append(json.loads(await asyncio.wait_for(conn.recv_bytes(), WAIT_S)))
            for start in range(0, len(pcm), 4800):
                await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[start : start + 4800]).decode())
            await conn.input_audio_buffer.commit()
            while not events[-1]["type"].endswith((".completed", ".failed", "error")):
                events.append(json.loads(await asyncio.wait_for(conn.recv_bytes(), WAIT_S)))
            return events

    try:
        with running_server(build_app(engine, ServerSettings(served_model_name=family))) as url:
            events = asyncio.run(session(url))
    finally:
        engine.shutdown()
    assert events[-1]["type"] == "conversation.item.input_audio_transcription.completed", events[-1]
    deltas = [e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert len(deltas) > 1
    assert "".join(deltas) == events[-1]["transcript"] == expected
