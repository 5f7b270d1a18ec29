"""The realtime client examples of docs/serving.md run as written against a real server (tiny.en on CPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import oasr
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from serving_harness import running_server, small_engine

DOC = Path(__file__).parents[1] / "docs" / "serving.md"
JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


def _section_code(title: str) -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


@pytest.fixture(scope="module")
def server():
    engine = small_engine("tiny.en", mode="thread")
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="tiny.en", api_keys=("KEY",)))) as url:
            yield url
    finally:
        engine.shutdown()


@pytest.mark.parametrize("example", [1, 2], ids=["openai", "websockets"])
def test_the_realtime_examples_print_the_transcript(server, example: int, capsys) -> None:
    helper, *examples = _section_code("Realtime transcription from Python")
    assert len(examples) == 2
    code = examples[example - 1].replace("http://127.0.0.1:8000", server)
    code = code.replace("ws://127.0.0.1:8000", server.replace("http://", "ws://")).replace("speech.wav", str(JFK))
    exec(compile(helper + "\n" + code, f"docs/serving.md example {example}", "exec"), {"__name__": "docs"})
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].startswith("And so my fellow Americans") and "your country" in printed[-1]
    assert printed[-2] == printed[-1]  # the deltas, printed as they came, add up to the transcript
