"""The Python API: inputs of every kind, typed errors that name the input, options the model cannot serve."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

import oasr
from oasr.audio import load_audio
from oasr.errors import AudioDecodeError, UnsupportedOptionError
from speech_data import audio_path, manifest_entries, require_speech_data

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
JFK_TEXT = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."


def empty_wav(path: Path) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
    return path


@pytest.fixture
def bad_inputs(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "notes.wav").write_text("this is a text file, not audio\n")
    (tmp_path / "truncated.flac").write_bytes(JFK.read_bytes()[:100])
    return {
        "empty": tmp_path / "empty.wav",
        "zero samples": empty_wav(tmp_path / "zero.wav"),
        "truncated": tmp_path / "truncated.flac",
        "text named .wav": tmp_path / "notes.wav",
    }


def test_path_bytes_and_array_inputs_agree(tiny_en) -> None:
    by_path, by_bytes, by_array = oasr.transcribe([JFK, JFK.read_bytes(), load_audio(JFK)], tiny_en)
    assert by_path.text == JFK_TEXT
    assert by_path.token_ids == by_bytes.token_ids == by_array.token_ids
    assert by_path.language == "en" and by_path.duration_s == pytest.approx(11.0, abs=0.01)
    assert by_path.source == str(JFK) and by_bytes.source == "<input 1>"


@pytest.mark.parametrize("case", ["empty", "zero samples", "truncated", "text named .wav"])
def test_bad_input_raises_a_typed_error_naming_it(tiny_en, bad_inputs, case: str) -> None:
    with pytest.raises(AudioDecodeError) as info:
        oasr.transcribe(bad_inputs[case], tiny_en)
    assert str(bad_inputs[case]) in str(info.value)


def test_bad_inputs_are_skipped_without_losing_the_good_ones(tiny_en, bad_inputs) -> None:
    inputs = [JFK, *bad_inputs.values(), JFK]
    results = oasr.transcribe(inputs, tiny_en, skip_errors=True, batch_size=1)
    assert [r.source for r in results] == [str(p) for p in inputs]
    assert [r.ok for r in results] == [True, False, False, False, False, True]
    assert results[0].text == results[-1].text == JFK_TEXT
    assert all(str(r.source) in r.error for r in results if not r.ok)


def test_empty_array_is_refused(tiny_en) -> None:
    with pytest.raises(AudioDecodeError, match="zero samples"):
        oasr.transcribe(np.zeros(0, dtype=np.float32), tiny_en)


def test_english_only_model_refuses_other_languages_and_translation(tiny_en) -> None:
    with pytest.raises(UnsupportedOptionError, match="English-only"):
        oasr.transcribe(JFK, tiny_en, language="de")
    with pytest.raises(UnsupportedOptionError, match="cannot translate"):
        oasr.transcribe(JFK, tiny_en, task="translate")


def test_multilingual_model_detects_the_language(base_multilingual) -> None:
    require_speech_data()
    wanted = {"de", "es", "fr", "ru", "ja"}
    entries = [e for e in manifest_entries() if e["language"] in wanted and e["duration_s"] <= 30]
    results = oasr.transcribe([audio_path(e) for e in entries], base_multilingual)
    assert [r.language for r in results] == [e["language"] for e in entries]


def test_audio_longer_than_one_window_is_decoded_window_by_window(tiny_en) -> None:
    audio = load_audio(JFK)
    gap = np.zeros(16000 * 22, dtype=np.float32)
    long = np.concatenate([audio, gap, audio])  # 44 s: JFK in the first and in the second window
    result = oasr.transcribe(long, tiny_en)[0]
    assert [s.start for s in result.segments] == [0.0, 30.0]
    assert result.segments[-1].end == pytest.approx(44.0, abs=0.01)
    assert result.text.lower().count("ask what you can do for your country") == 2


def test_batch_size_does_not_change_results(tiny_en) -> None:
    require_speech_data()
    paths = [audio_path(e) for e in manifest_entries() if e["language"] == "en" and e["duration_s"] <= 30][:6]
    one = oasr.transcribe(paths, tiny_en, batch_size=1)
    many = oasr.transcribe(paths, tiny_en, batch_size=4)
    assert [r.token_ids for r in one] == [r.token_ids for r in many]
