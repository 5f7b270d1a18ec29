"""FunASR's online Paraformer (``paraformer_streaming``) fed piece by piece, against FunASR's own partials.

tests/data/funasr/paraformer_streaming/ is a tiny random ``ParaformerStreaming`` built with funasr 1.4.16's
classes; paraformer_streaming.json holds the text FunASR's ``generate(input=piece, cache=cache, is_final=...,
chunk_size=[0, 10, 5], encoder_chunk_look_back=4, decoder_chunk_look_back=1)`` returned for each 600 ms piece
of three shared clips, the last piece with ``is_final`` (scripts/funasr_oracle/build_streaming.py). The third
clip ends 576 samples into its last piece, which FunASR decodes by re-encoding the previous step's overlap.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from oasr.errors import CheckpointError
from oasr.models.paraformer_streaming.config import ChunkConfig
from oasr.models.paraformer_streaming.stream import load_paraformer_streaming
from tests.speech_data import audio_path, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"
MODEL = DATA / "paraformer_streaming"


def golden() -> dict:
    return json.loads((DATA / "paraformer_streaming.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model():
    return load_paraformer_streaming(MODEL)


def clips() -> list[np.ndarray]:
    by_id = {e["id"]: e for e in require_speech_data()}
    return [sf.read(str(audio_path(by_id[name])), dtype="float32")[0] for name in golden()["clips"]]


def feed(model, audio: np.ndarray, piece: int) -> list[list[int]]:
    stream = model.open(ChunkConfig((0, 10, 5), 4, 1))
    num_pieces = (len(audio) - 1) // piece + 1
    return [stream.push(audio[i * piece: (i + 1) * piece], final=i == num_pieces - 1) for i in range(num_pieces)]


def test_600ms_pieces_give_funasrs_partials_and_final(model) -> None:
    expected = golden()
    assert expected["chunk_samples"] == 9600 and expected["chunk_size"] == [0, 10, 5]
    for audio, partials in zip(clips(), expected["partials"], strict=True):
        assert sum(1 for p in partials if p) >= 3  # the oracle decided tokens in most pieces
        texts = [model.tokenizer.decode(ids) for ids in feed(model, audio, expected["chunk_samples"])]
        assert texts == partials


def test_pieces_of_any_length_decide_the_same_tokens(model) -> None:
    # The stream keeps what is short of a whole 600 ms step until more arrives, as FunASR's cache does.
    audio = clips()[0]
    whole = [t for ids in feed(model, audio, 9600) for t in ids]
    for piece in (1000, 4321, len(audio)):
        assert [t for ids in feed(model, audio, piece) for t in ids] == whole


def test_audio_after_the_final_piece_is_refused(model) -> None:
    stream = model.open()
    stream.push(np.zeros(9600, dtype=np.float32), final=True)
    with pytest.raises(ValueError, match="after the stream's final piece"):
        stream.push(np.zeros(10, dtype=np.float32))


def test_an_offline_paraformer_folder_is_refused_naming_the_field() -> None:
    with pytest.raises(CheckpointError, match="field model is 'Paraformer'"):
        load_paraformer_streaming(DATA / "paraformer")


def test_chunk_settings_funasr_serves_otherwise_are_refused() -> None:
    with pytest.raises(ValueError, match="look_back"):
        ChunkConfig((0, 10, 5), 0, 1)
    with pytest.raises(ValueError, match="chunk_size"):
        ChunkConfig((0, 10, 0), 4, 1)
