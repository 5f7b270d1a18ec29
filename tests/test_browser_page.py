"""The page at ``/`` end to end: a real server (tiny.en on CPU, an API key set, loopback Host names only) and
Debian's headless chromium driven by Playwright.

The microphone is chromium's fake capture device playing a WAV made from jfk.flac (48 kHz, silence around the
speech so server VAD ends the turn; ``%noloop`` so it plays once): the page streams it over /v1/realtime with
the key as a WebSocket subprotocol, and its final caption must say what ``oasr.transcribe`` says of the clip.
A file chosen in the page goes to /v1/audio/transcriptions: its text must be offline's exactly, and its SRT
download the same words. Screenshots go to ``$OASR_TEST_ARTIFACTS`` (else the test's tmp_path).

Without chromium or Playwright the browser tests skip, unless ``OASR_REQUIRE_BROWSER=1`` (CI's ``.ci/run``),
where they fail: a browser test that silently skips in CI is no test.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
import soxr
import websockets

import oasr
from oasr.audio import load_audio
from oasr.engine.combined import Engine
from oasr.hosting.core import EngineCore
from oasr.hosting.inproc import InprocClient
from oasr.serving.app import build_app
from oasr.serving.page import page_config_of
from oasr.serving.serving import OpenAIServingTranscription
from oasr.serving.settings import LOOPBACK_HOSTS, ServerSettings
from nemotron_reference import build_reference, save
from serving_harness import running_server, small_engine

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
API_KEY = "page-test-key"
CHROMIUM = os.environ.get("OASR_CHROMIUM", "/usr/bin/chromium")
CAPTURE_RATE = 48_000  # chromium's fake device plays the file at its own rate; 48 kHz is what a mic gives
LEAD_SILENCE_S = 1.0  # the fake device starts with the track, a moment before the page's capture node runs
TAIL_SILENCE_S = 2.0  # past server VAD's 500 ms of silence, so the turn ends without a Stop
KEY_WORDS = "ask not what your country can do for you"
CAPTION_TIMEOUT_MS = 90_000  # the clip plays in real time (14 s), then tiny.en decodes on a shared CPU
MIN_WORD_SIMILARITY = 0.9  # the mic path resamples twice (page, server): a word may differ from offline
CHROMIUM_FLAGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream")
# True once ``microphoneMs`` have passed since the recorder started and every caption line is final.
CAPTIONS_DONE = """(microphoneMs) => {
  const lines = [...document.querySelectorAll('#captions li')];
  return performance.now() - window.recordingSince > microphoneMs && lines.length > 0
    && lines.every(li => li.className === 'final');
}"""
# Records each caption line's class and text after every change, so a partial state that lasts one event is seen.
CAPTION_RECORDER = """() => {
  window.captionStates = [];
  window.recordingSince = performance.now();
  new MutationObserver(() => {
    for (const li of document.querySelectorAll('#captions li')) {
      window.captionStates.push([li.dataset.itemId, li.className, li.textContent,
                                 (performance.now() - window.recordingSince) / 1000]);
    }
  }).observe(document.getElementById('captions'), {childList: true, subtree: true, characterData: true,
                                                   attributes: true});
}"""


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, words(a), words(b)).ratio()


@pytest.fixture(scope="module")
def server() -> str:
    engine = small_engine("tiny.en")
    served = ServerSettings(served_model_name="tiny.en", api_keys=(API_KEY,), allowed_hosts=LOOPBACK_HOSTS,
                            request_timeout_s=300)
    try:
        with running_server(build_app(engine, served), ws_max_size=served.realtime.max_frame_bytes) as url:
            yield url
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def offline_jfk(tiny_en) -> str:
    return oasr.transcribe([str(JFK)], model=tiny_en)[0].text.strip()


# ------------------------------------------------------------------------------------ the routes, no browser

def test_the_page_and_its_files_load_without_a_key_and_the_api_still_needs_one(server):
    page = httpx.get(f"{server}/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'aria-live="polite"' in page.text and "/static/page.js" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for name in re.findall(r'"/static/([\w.-]+)"', page.text) + ["capture-worklet.js"]:
        assert httpx.get(f"{server}/static/{name}", timeout=30).status_code == 200, name
    missing = httpx.get(f"{server}/static/settings.py", timeout=30)  # only the page's own files are served
    assert missing.status_code == 404 and "error" in missing.json()
    assert httpx.get(f"{server}/v1/models", timeout=30).status_code == 401
    # A rebinding site's name in Host is refused on the page too.
    assert httpx.get(f"{server}/", headers={"Host": "elsewhere.example"}, timeout=30).status_code == 400


async def _handshake(url: str, subprotocols: list[str], origin: str | None) -> tuple[str | None, dict]:
    socket_url = url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    async with websockets.connect(socket_url, subprotocols=subprotocols, origin=origin) as socket:
        return socket.subprotocol, json.loads(await socket.recv())


def test_a_browser_socket_authenticates_with_the_key_subprotocol_from_the_servers_own_page(server):
    offered = ["realtime", f"openai-insecure-api-key.{API_KEY}"]
    chosen, first = asyncio.run(_handshake(server, offered, origin=server))
    assert chosen == "realtime" and first["type"] == "session.created"
    chosen, first = asyncio.run(_handshake(server, [*offered, "openai-beta.realtime-v1"], origin=server))
    assert chosen == "realtime" and first["type"] == "transcription_session.created"
    for subprotocols in (["realtime"], ["realtime", "openai-insecure-api-key.wrong"]):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            asyncio.run(_handshake(server, subprotocols, origin=server))
        assert refused.value.response.status_code == 401
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:  # another site's page, with the key
        asyncio.run(_handshake(server, offered, origin="http://elsewhere.example"))
    assert refused.value.response.status_code == 403


# ------------------------------------------------------------------------------------ the page in chromium

def _playwright():
    """Playwright's sync API, or the reason the browser tests cannot run (a failure where they must)."""
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "Playwright is not installed (pip install playwright; its own browser download is not needed)"
    if reason is None and not os.access(CHROMIUM, os.X_OK):
        reason = f"no chromium at {CHROMIUM} (apt-get install chromium; scripts/setup.sh does this as root)"
    if reason is None:
        return sync_playwright
    if os.environ.get("OASR_REQUIRE_BROWSER") == "1":
        pytest.fail(f"OASR_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def _artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("OASR_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _capture_wav(folder: Path) -> tuple[Path, float]:
    """jfk.flac as the fake microphone plays it: 48 kHz 16-bit, with silence before and after; its seconds."""
    speech = soxr.resample(load_audio(JFK), 16_000, CAPTURE_RATE)
    audio = np.concatenate([np.zeros(int(LEAD_SILENCE_S * CAPTURE_RATE), np.float32), speech,
                            np.zeros(int(TAIL_SILENCE_S * CAPTURE_RATE), np.float32)])
    path = folder / "jfk-48k.wav"
    sf.write(path, np.clip(audio, -1, 1), CAPTURE_RATE, subtype="PCM_16")
    return path, len(audio) / CAPTURE_RATE


@dataclass
class BrowserPage:
    page: Any  # playwright.sync_api.Page (Playwright is imported only where it is present)
    microphone_s: float  # how long the fake microphone plays
    console: list[str] = field(default_factory=list)  # console messages and uncaught errors, for failures


@pytest.fixture(scope="module")
def streaming_server(tmp_path_factory) -> str:
    """A tiny random Nemotron streaming model (the cache-aware runtime: deltas while audio still arrives)."""
    checkpoint = save(build_reference(), tmp_path_factory.mktemp("nemotron-page"))
    engine = small_engine(str(checkpoint))
    served = ServerSettings(served_model_name="nemotron-tiny", api_keys=(API_KEY,), allowed_hosts=LOOPBACK_HOSTS,
                            request_timeout_s=300)
    try:
        with running_server(build_app(engine, served), ws_max_size=served.realtime.max_frame_bytes) as url:
            yield url
    finally:
        engine.shutdown()


@pytest.fixture
def browser(tmp_path, server) -> BrowserPage:
    """A page of a fresh headless chromium at the server's ``/``, its console kept; the fake microphone plays
    the clip once."""
    yield from _open_page(tmp_path, server)


@pytest.fixture
def streaming_browser(tmp_path, streaming_server) -> BrowserPage:
    yield from _open_page(tmp_path, streaming_server)


def _open_page(tmp_path: Path, server: str) -> Iterator[BrowserPage]:
    sync_playwright = _playwright()
    wav, microphone_s = _capture_wav(tmp_path)
    flags = [*CHROMIUM_FLAGS, f"--use-file-for-fake-audio-capture={wav}%noloop"]
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=flags, accept_downloads=True,
            permissions=["clipboard-read", "clipboard-write"])
        try:
            opened = BrowserPage(context.pages[0] if context.pages else context.new_page(), microphone_s)
            opened.page.on("console", lambda message: opened.console.append(f"{message.type}: {message.text}"))
            opened.page.on("pageerror", lambda error: opened.console.append(f"pageerror: {error}"))
            opened.page.goto(f"{server}/")
            opened.page.fill("#api-key", API_KEY)
            yield opened
        finally:
            context.close()


def _screenshot(page, tmp_path: Path, name: str) -> Path:
    path = _artifacts(tmp_path) / name
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


@pytest.mark.browser
@pytest.mark.slow
def test_the_microphone_button_streams_live_captions_that_match_offline(browser, offline_jfk, tmp_path):
    """Server VAD cuts the clip at its pauses (jfk has one after "Americans"), one caption line per turn; the
    lines read together say what offline transcription says of the whole clip."""
    page = browser.page
    page.evaluate(CAPTION_RECORDER)
    page.click("#mic")
    try:  # the clip has played out and every line it made is final
        page.wait_for_function(CAPTIONS_DONE, arg=browser.microphone_s * 1000, timeout=CAPTION_TIMEOUT_MS)
    except Exception:
        _screenshot(page, tmp_path, "live-captions-timeout.png")
        raise AssertionError(f"captions not final; status {page.text_content('#live-status')!r}; captions "
                             f"{page.locator('#captions li').all_text_contents()}; console {browser.console}") from None
    _screenshot(page, tmp_path, "live-captions.png")
    finals = dict(page.evaluate("[...document.querySelectorAll('#captions li')].map(li => [li.dataset.itemId, "
                                "li.textContent])"))
    caption = " ".join(finals.values())
    assert KEY_WORDS in " ".join(words(caption)), (finals, offline_jfk)
    assert similarity(caption, offline_jfk) >= MIN_WORD_SIMILARITY, (finals, offline_jfk)
    # Each line grew in place as a partial line (styled apart) before it turned final.
    partial = [(item, text) for item, cls, text, _ in page.evaluate("window.captionStates")
               if cls == "partial" and text != "…"]
    assert partial and all(finals[item].startswith(text) for item, text in partial), (partial, finals)
    assert page.get_attribute("#mic", "aria-pressed") == "true"
    page.click("#mic")  # Stop: no turn open, so the socket closes at once
    page.wait_for_selector("#mic[aria-pressed='false']", timeout=10_000)
    assert page.text_content("#live-status") == "Microphone off."


@pytest.mark.browser
@pytest.mark.slow
def test_a_streaming_model_draws_partial_captions_while_the_speaker_is_still_talking(streaming_browser, tmp_path):
    """With a streaming model the server sends deltas as the audio arrives, so a caption line grows, styled as
    partial, before the clip's speech has ended; each partial state is the start of the line's final text."""
    page = streaming_browser.page
    page.wait_for_selector("#model strong", timeout=30_000)
    assert "a streaming model" in page.text_content("#model")
    page.evaluate(CAPTION_RECORDER)
    page.click("#mic")
    try:
        page.wait_for_function(CAPTIONS_DONE, arg=streaming_browser.microphone_s * 1000, timeout=CAPTION_TIMEOUT_MS)
    except Exception:
        _screenshot(page, tmp_path, "streaming-captions-timeout.png")
        raise AssertionError(f"captions not final; status {page.text_content('#live-status')!r}; captions "
                             f"{page.locator('#captions li').all_text_contents()}; "
                             f"console {streaming_browser.console}") from None
    _screenshot(page, tmp_path, "streaming-captions.png")
    finals = dict(page.evaluate("[...document.querySelectorAll('#captions li')].map(li => [li.dataset.itemId, "
                                "li.textContent])"))
    assert finals and all(text.strip() for text in finals.values()), finals
    states = page.evaluate("window.captionStates")
    partial = [(item, text, at) for item, cls, text, at in states if cls == "partial" and text not in ("", "…")]
    assert all(finals[item].startswith(text) for item, text, _ in partial), (partial, finals)
    speech_ends_s = streaming_browser.microphone_s - TAIL_SILENCE_S
    assert len({text for _, text, _ in partial}) >= 2, partial  # it grew, delta by delta
    assert min(at for _, _, at in partial) < speech_ends_s - 2.0, (partial, speech_ends_s)  # while still talking


@pytest.mark.browser
def test_a_chosen_file_is_transcribed_and_its_subtitles_download(browser, offline_jfk, tmp_path):
    page = browser.page
    # A file dropped on the zone takes the same path; one that is not audio is refused, and the page says so.
    dropped = page.evaluate_handle("() => { const data = new DataTransfer(); "
                                   "data.items.add(new File(['not audio'], 'notes.txt')); return data; }")
    page.dispatch_event("#drop", "drop", {"dataTransfer": dropped})
    page.wait_for_selector("#file-status.error", timeout=30_000)
    assert "Could not transcribe notes.txt" in page.text_content("#file-status")
    assert page.is_disabled("#download-srt")
    page.set_input_files("#file", str(JFK))
    page.wait_for_selector("#transcript:not(:empty)", timeout=60_000)
    assert page.text_content("#transcript") == offline_jfk, (page.text_content("#file-status"), browser.console)
    _screenshot(page, tmp_path, "file-transcript.png")
    page.click("#copy-transcript")
    assert page.evaluate("navigator.clipboard.readText()") == offline_jfk
    downloads = {}
    for fmt in ("srt", "vtt"):
        with page.expect_download(timeout=60_000) as download:
            page.click(f"#download-{fmt}")
        assert download.value.suggested_filename == f"jfk.{fmt}"
        downloads[fmt] = Path(download.value.path()).read_text()
    srt, vtt = downloads["srt"], downloads["vtt"]
    assert srt.startswith("1\n00:00:00,000 --> ") and vtt.startswith("WEBVTT")
    cue_text = [line for line in srt.splitlines() if line and not line.isdigit() and "-->" not in line]
    assert words(" ".join(cue_text)) == words(offline_jfk)


@pytest.mark.browser
def test_without_the_key_the_page_says_why_the_socket_was_refused(browser):
    page = browser.page
    page.fill("#api-key", "")
    page.click("#mic")
    page.wait_for_selector("#live-status.error", timeout=30_000)
    assert "Incorrect or missing API key" in page.text_content("#live-status")
    assert page.get_attribute("#mic", "aria-pressed") == "false"


def test_the_page_config_names_the_model_and_offers_what_it_serves(server, base_multilingual):
    assert httpx.get(f"{server}/page/config", timeout=30).json() == {  # no key needed, as for the page
        "model": "tiny.en", "languages": [], "translate": False, "streaming": False}  # English-only
    engine = InprocClient(EngineCore(Engine(base_multilingual)))
    try:
        serving = OpenAIServingTranscription(engine, ServerSettings(served_model_name="base"))
        config = asyncio.run(page_config_of(serving))
    finally:
        engine.shutdown()
    assert config["model"] == "base" and config["translate"] is True and config["streaming"] is False
    assert {"code": "de", "name": "German"} in config["languages"] and len(config["languages"]) == 99


@pytest.mark.browser
def test_the_page_names_its_model_and_hides_choices_an_english_only_model_lacks(browser):
    page = browser.page
    page.wait_for_selector("#model strong", timeout=30_000)
    assert page.text_content("#model") == "Talking to tiny.en."
    assert page.is_hidden("#choices") and page.is_disabled("#copy-captions")


@pytest.mark.browser
def test_language_and_translate_choices_reach_the_request(browser, tmp_path):
    """A multilingual model's choices, as the config of one would offer them: the chosen language goes with the
    file, and translation sends it to the translations route."""
    page = browser.page
    config = {"model": "base", "languages": [{"code": "en", "name": "English"}, {"code": "de", "name": "German"}],
              "translate": True, "streaming": True}
    page.route("**/page/config", lambda route: route.fulfill(json=config))
    page.reload()
    page.fill("#api-key", API_KEY)
    page.wait_for_selector("#choices:not([hidden])", timeout=30_000)
    assert page.text_content("#model").startswith("Talking to base, a streaming model")
    page.select_option("#language", "de")
    page.check("#translate")
    _screenshot(page, tmp_path, "choices.png")
    with page.expect_request("**/v1/audio/translations", timeout=30_000) as sent:
        page.set_input_files("#file", str(JFK))
    body = sent.value.post_data_buffer
    assert b'name="language"\r\n\r\nde\r\n' in body and b'name="model"\r\n\r\ntiny.en' in body
