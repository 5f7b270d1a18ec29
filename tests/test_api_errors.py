"""``oasr.transcribe`` over several inputs when some fail: every input runs, and no good result is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

import oasr
from oasr.errors import AudioDecodeError, TranscriptionFailedError

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
JFK_TEXT = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."


def test_a_failed_input_raises_after_all_ran_with_every_result_on_the_error(tiny_en, tmp_path: Path) -> None:
    missing = tmp_path / "missing.wav"
    with pytest.raises(TranscriptionFailedError) as info:
        oasr.transcribe([JFK, missing, JFK.read_bytes()], tiny_en)
    error = info.value
    assert isinstance(error, AudioDecodeError) and error.source == str(missing)  # what callers caught before
    assert str(error).startswith(f"{missing}: file not found (1 of 3 inputs failed")
    assert [r.text for r in error.results] == [JFK_TEXT, "", JFK_TEXT]
    assert [r.ok for r in error.results] == [True, False, True]
    assert [r.source for r in error.failures] == [str(missing)]


def test_skip_errors_returns_every_result_with_the_failures_marked(tiny_en, tmp_path: Path) -> None:
    missing = tmp_path / "missing.wav"
    results = oasr.transcribe([missing, JFK], tiny_en, skip_errors=True)
    assert [r.ok for r in results] == [False, True]
    assert results[0].error == f"{missing}: file not found" and results[1].text == JFK_TEXT


def test_one_failed_input_alone_is_named_without_counts(tiny_en, tmp_path: Path) -> None:
    with pytest.raises(TranscriptionFailedError, match=r"missing\.wav: file not found$"):
        oasr.transcribe(tmp_path / "missing.wav", tiny_en)
