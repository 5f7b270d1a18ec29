"""The page at ``/`` on a server with a diarization model: chromium's fake microphone plays the two-speaker
mixture, the page streams it over /v1/realtime, and each final caption line shows the speakers the server's
``conversation.item.input_audio_transcription.segment`` events named for that item, each part led by
``Speaker X:`` (frames read off the page's own socket)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
import soundfile as sf
import soxr

from nemotron3_diarization_reference import two_speaker_case
from oasr.audio import load_audio
from oasr.serving.app import build_app
from oasr.serving.settings import LOOPBACK_HOSTS, ServerSettings
from serving_harness import running_server, small_engine
from test_browser_page import API_KEY, CAPTION_TIMEOUT_MS, CAPTIONS_DONE, CAPTURE_RATE, CHROMIUM, CHROMIUM_FLAGS
from test_browser_page import LEAD_SILENCE_S, TAIL_SILENCE_S, _playwright, _screenshot


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    return two_speaker_case(tmp_path_factory.mktemp("diarized-page"))


@pytest.fixture(scope="module")
def server(case) -> str:
    checkpoint, _, _ = case
    engine = small_engine("tiny.en")
    served = ServerSettings(served_model_name="tiny.en", api_keys=(API_KEY,), allowed_hosts=LOOPBACK_HOSTS,
                            request_timeout_s=300, diarization_model=str(checkpoint), diarization_device="cpu")
    try:
        with running_server(build_app(engine, served), ws_max_size=served.realtime.max_frame_bytes) as url:
            yield url
    finally:
        engine.shutdown()


@pytest.mark.browser
def test_final_captions_show_who_spoke_each_part(server, case, tmp_path):
    sync_playwright = _playwright()
    _, wav, _ = case
    speech = soxr.resample(load_audio(wav), 16_000, CAPTURE_RATE)
    audio = np.concatenate([np.zeros(int(LEAD_SILENCE_S * CAPTURE_RATE), np.float32), speech,
                            np.zeros(int(TAIL_SILENCE_S * CAPTURE_RATE), np.float32)])
    capture = tmp_path / "two-speakers-48k.wav"
    sf.write(capture, np.clip(audio, -1, 1), CAPTURE_RATE, subtype="PCM_16")
    segments: dict[str, list[dict]] = defaultdict(list)

    def on_frame(payload) -> None:
        event = json.loads(payload)
        if event["type"] == "conversation.item.input_audio_transcription.segment":
            segments[event["item_id"]].append(event)

    flags = [*CHROMIUM_FLAGS, f"--use-file-for-fake-audio-capture={capture}%noloop"]
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                               headless=True, args=flags)
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.on("websocket", lambda socket: socket.on("framereceived", on_frame))
            page.goto(f"{server}/")
            page.fill("#api-key", API_KEY)
            page.evaluate("() => { window.recordingSince = performance.now(); }")
            page.click("#mic")
            page.wait_for_function(CAPTIONS_DONE, arg=len(audio) / CAPTURE_RATE * 1000, timeout=CAPTION_TIMEOUT_MS)
            _screenshot(page, tmp_path, "diarized-captions.png")
            lines = page.evaluate("[...document.querySelectorAll('#captions li')].map(li => [li.dataset.itemId, "
                                  "li.dataset.speakers || null, li.textContent, "
                                  "[...li.querySelectorAll('.speaker')].map(s => s.textContent)])")
        finally:
            context.close()
    assert segments and lines
    for item, num_speakers, text, labels in lines:
        if not text.strip() or text == "…":
            continue
        mine = segments[item]
        assert mine, (item, text)  # every caption with words had its speakers sent
        assert num_speakers == str(len(mine))
        assert labels == [f"Speaker {s['speaker']}: " for s in mine]
        assert text == "\n".join(f"Speaker {s['speaker']}: {s['text']}" for s in mine)
