"""Beam search from the Python API and the CLI: parallel windows, openai-whisper's sequential ``transcribe()`` loop
(beam search at temperature 0, sampling above), and the options' errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import oasr
from oasr.cli import main
from oasr.transcription.offline import engine_config_for
from oasr.transcription.sequential import LongFormCursor
from oasr.types import FallbackOptions, TranscribeOptions
from openai_whisper_reference import openai_whisper_from
from speech_data import clips
from test_openai_whisper_parity import NO_FALLBACK, assert_same_segments, check_invariants

whisper = pytest.importorskip("whisper")

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


@pytest.fixture(scope="module")
def reference(tiny_en):
    return openai_whisper_from(tiny_en)


def test_transcribe_with_beam_size_gives_openai_whisper_s_beam_text(tiny_en, reference) -> None:
    short = clips(("coqui_ljspeech_LJ001-0001", "ps_cards_004"))
    results = oasr.transcribe([c.audio for c in short], tiny_en, beam_size=5, batch_size=2)
    for clip, ours in zip(short, results, strict=True):
        theirs = whisper.decode(reference, tiny_en.features([clip.audio])[0],
                                whisper.DecodingOptions(language="en", fp16=False, beam_size=5, without_timestamps=True))
        assert ours.token_ids == theirs.tokens and ours.text == theirs.text, clip.id
    greedy = oasr.transcribe(short[0].audio, tiny_en)[0]
    assert greedy.token_ids != results[0].token_ids


def test_a_window_decodes_on_beam_size_rows() -> None:
    config = engine_config_for(TranscribeOptions(batch_size=3, beam_size=4))
    assert config.scheduler.max_num_seqs == 12 and config.scheduler.max_encode_rows == 3


def test_sequential_beam_search_equals_openai_transcribe(tiny_en, reference) -> None:
    short = clips(("whisper_jfk", "lhotse_ami_ES2011a_headset_40-46s"))
    options = TranscribeOptions(long_form="sequential", fallback=NO_FALLBACK, beam_size=5)
    results = oasr.transcribe([c.audio for c in short], tiny_en, options=options)
    for clip, ours in zip(short, results, strict=True):
        theirs = reference.transcribe(clip.audio, temperature=0.0, beam_size=5, fp16=False, language="en")
        assert_same_segments(ours, theirs)
        check_invariants(ours, tiny_en.tokenizer)


def test_sequential_fallback_samples_above_temperature_zero_as_openai_whisper_does(tiny_en) -> None:
    clip = clips(("whisper_jfk",))[0]
    options = TranscribeOptions(long_form="sequential", beam_size=5, patience=2.0, length_penalty=0.5,
                                fallback=FallbackOptions(temperatures=(0.0, 0.4)))
    window = tiny_en.features.config.n_frames
    mel = torch.zeros(tiny_en.config.num_mel_bins, 2 * window)  # one window of content, one of padding
    cursor = LongFormCursor("jfk", clip.audio, mel, loaded=tiny_en, options=options, window_frames=window)
    first = cursor.next_request().options
    assert (first.beam_size, first.patience, first.length_penalty, first.temperature) == (5, 2.0, 0.5, 0.0)
    cursor.attempt = 1
    retry = cursor.next_request().options
    assert (retry.beam_size, retry.patience, retry.length_penalty, retry.temperature) == (None, None, None, 0.4)


def test_cli_beam_size_and_its_errors(capsys) -> None:
    args = ["transcribe", str(JFK), "--device", "cpu", "--output-format", "jsonl", "--quiet"]
    assert main([*args, "--beam-size", "2", "--patience", "1.5", "--length-penalty", "0.2"]) == 0
    assert json.loads(capsys.readouterr().out)["text"].startswith("And so my fellow Americans")
    assert main([*args, "--patience", "2"]) == 2
    assert "give beam_size too" in capsys.readouterr().err
    assert main([*args, "--beam-size", "0"]) == 2
    assert "beam_size must be an integer >= 1" in capsys.readouterr().err
