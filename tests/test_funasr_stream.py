"""FunASR's online Paraformer (``paraformer_streaming``) fed piece by piece, against FunASR's own partials.

tests/data/funasr/paraformer_streaming/ is a tiny random ``ParaformerStreaming`` built with funasr 1.4.16's
classes; paraformer_streaming.json holds the text FunASR's ``generate(input=piece, cache=cache, is_final=...,
chunk_size=[0, 10, 5], encoder_chunk_look_back=4, decoder_chunk_look_back=1)`` returned for each 600 ms piece
of three shared clips, the last piece with ``is_final`` (scripts/funasr_oracle/build_streaming.py). The third
clip ends 576 samples into its last piece, which FunASR decodes by re-encoding the previous step's overlap.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from oasr.cli import main
from oasr.engine.streams import StreamingEngine
from oasr.models.loader import from_pretrained
from oasr.models.paraformer_streaming.stream import ParaformerStream
from oasr.streaming.types import StreamOptions
from tests.speech_data import audio_path, require_speech_data

DATA = Path(__file__).parent / "data" / "funasr"
MODEL = DATA / "paraformer_streaming"
PIECE = 9600  # 600 ms: FunASR's chunk_size[1] = 10 LFR frames of 60 ms


def golden() -> dict:
    return json.loads((DATA / "paraformer_streaming.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def loaded():
    return from_pretrained(MODEL, device="cpu", dtype="float32")


def clip_paths() -> list[str]:
    by_id = {e["id"]: e for e in require_speech_data()}
    return [str(audio_path(by_id[name])) for name in golden()["clips"]]


def clips() -> list[np.ndarray]:
    return [sf.read(path, dtype="float32")[0] for path in clip_paths()]


def pieces(audio: np.ndarray, size: int) -> list[np.ndarray]:
    return [audio[i: i + size] for i in range(0, len(audio), size)]


def feed(loaded, audio: np.ndarray, size: int) -> list[list[int]]:
    stream = ParaformerStream(loaded.model, loaded.features)
    parts = pieces(audio, size)
    return [stream.push(part, final=i == len(parts) - 1) for i, part in enumerate(parts)]


def test_the_golden_is_funasrs_example_setting() -> None:
    expected = golden()
    assert expected["chunk_samples"] == PIECE and expected["chunk_size"] == [0, 10, 5]
    assert (expected["encoder_chunk_look_back"], expected["decoder_chunk_look_back"]) == (4, 1)
    for partials in expected["partials"]:
        assert sum(1 for p in partials if p) >= 3  # the oracle decided tokens in most pieces


def test_600ms_pieces_give_funasrs_partials_and_final(loaded) -> None:
    for audio, partials in zip(clips(), golden()["partials"], strict=True):
        assert [loaded.tokenizer.decode(ids) for ids in feed(loaded, audio, PIECE)] == partials


def test_the_streaming_engine_gives_funasrs_partials_chunk_by_chunk(loaded) -> None:
    engine = StreamingEngine(loaded)
    for audio, partials in zip(clips(), golden()["partials"], strict=True):
        stream_id = engine.open(StreamOptions())
        parts, texts, finals = pieces(audio, PIECE), [], []
        for index, part in enumerate(parts):
            engine.push(stream_id, part)
            if index == len(parts) - 1:
                engine.close(stream_id)
            new: list[int] = []
            while engine.has_ready_work():
                for event in engine.step().events:
                    new += event.new_token_ids
                    finals += [event.text] if event.closed else []
            texts.append(loaded.tokenizer.decode(new))
        assert texts == partials
        assert len(finals) == 1 and finals[0] == loaded.tokenizer.decode(
            [t for ids in feed(loaded, audio, PIECE) for t in ids])


def test_streams_stepped_together_decide_what_each_decides_alone(loaded) -> None:
    # Five streams of different audio, opened at different ticks: a step batches streams still filling their
    # look-back with ones past it, and streams closing (one in a tail step) with ones going on.
    audio = clips()
    streams = [audio[0], audio[1], audio[2], audio[0][4321:], audio[2][: len(audio[2]) // 2]]
    starts = [0, 1, 2, 2, 3]
    alone = [feed(loaded, samples, PIECE) for samples in streams]
    engine = StreamingEngine(loaded)
    batch_sizes: list[int] = []
    step = engine.runtime.step

    def counted(batch, windows):
        batch_sizes.append(len(batch.rows))
        return step(batch, windows)

    engine.runtime.step = counted
    ids: dict[int, str] = {}
    together: list[list[list[int]]] = [[] for _ in streams]
    for tick in range(max(s + len(a) for s, a in zip(starts, alone, strict=True))):
        for index, (samples, start) in enumerate(zip(streams, starts, strict=True)):
            parts = pieces(samples, PIECE)
            if not start <= tick < start + len(parts):
                continue
            if tick == start:
                ids[index] = engine.open(StreamOptions())
            engine.push(ids[index], parts[tick - start])
            if tick - start == len(parts) - 1:
                engine.close(ids[index])
        new: dict[str, list[int]] = {stream_id: [] for stream_id in ids.values()}
        while engine.has_ready_work():
            for event in engine.step().events:
                new[event.stream_id] += event.new_token_ids
        for index, (samples, start) in enumerate(zip(streams, starts, strict=True)):
            if start <= tick < start + len(alone[index]):
                together[index].append(new[ids[index]])
    assert together == alone
    assert max(batch_sizes) == len(streams)  # all five were stepped in one batch at some point
    assert sum(1 for ids_ in (t for a in alone for t in a) if ids_) >= 10  # the streams decided tokens


def test_a_decoder_reset_in_a_batch_is_the_streams_own(loaded) -> None:
    # An endpoint resets one stream's decoder (its memory and cross-attention caches masked out from then on)
    # while the other stream of the batch goes on: each decides what it decides alone with the same reset.
    from oasr.models.paraformer_streaming.frontend import OnlineFrontend
    from oasr.models.paraformer_streaming.state import StreamSlots
    from oasr.models.paraformer_streaming.stream import StepRow, step_streams

    model, audio = loaded.model, clips()[:2]
    steps = min(len(a) for a in audio) // PIECE
    alone = []
    for index, samples in enumerate(audio):
        stream = ParaformerStream(model, loaded.features)
        decided = []
        for step in range(steps):
            if index == 0 and step == 2:
                stream.reset_decoder()
            decided.append(stream.step(samples[step * PIECE: (step + 1) * PIECE], False)[0])
        alone.append(decided)
    slots = StreamSlots(model, model.chunk, 2)
    slots.open([0, 1])
    frontends = [OnlineFrontend(loaded.features) for _ in audio]
    together: list[list[list[int]]] = [[], []]
    for step in range(steps):
        if step == 2:
            slots.reset_decoder([0])
        rows = [StepRow(i, frontends[i], a[step * PIECE: (step + 1) * PIECE], False) for i, a in enumerate(audio)]
        for index, (ids, _) in enumerate(step_streams(model, slots, rows)):
            together[index].append(ids)
    assert together == alone
    assert all(alone[0][2:]) and alone[0][2:] != [ids for ids in feed(loaded, audio[0], PIECE)[2:steps]]


def test_fbank_calls_padded_to_buckets_give_the_same_frames(loaded) -> None:
    # On CUDA a step's fbank call is padded to a power-of-two of rows and a multiple of 64 frames (so cuFFT plans
    # repeat); the padding must not reach any stream's frames.
    from oasr.models.paraformer_streaming.frontend import OnlineFrontend, lfr_features

    frontends = [OnlineFrontend(loaded.features) for _ in range(3)]
    for step in range(3):
        works = []
        for index, (frontend, audio) in enumerate(zip(frontends, clips(), strict=True)):
            frontend.push(audio[step * PIECE: (step + 1) * PIECE])
            works.append(frontend.plan(final=step == 2 and index == 1))  # one stream closes early
        exact = lfr_features(loaded.features, works, torch.device("cpu"), bucketed=False)
        padded = lfr_features(loaded.features, works, torch.device("cpu"), bucketed=True)
        assert [len(f) for f in exact] == [len(f) for f in padded] and all(len(f) for f in exact)
        for a, b in zip(exact, padded, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_the_unfolded_convolutions_equal_the_modules(loaded) -> None:
    # Off the CPU the FSMN memories and the CIF's convolution are computed as windows times taps (no cuDNN plan
    # per shape): the same values.
    from oasr.models.paraformer_streaming.layers import cif_weights, depthwise

    torch.manual_seed(0)
    model = loaded.model
    for conv in (model.encoder.encoders[0].self_attn.fsmn_block, model.decoder.decoders[0].self_attn.fsmn_block):
        x = torch.randn(3, conv.weight.shape[0], 17)
        torch.testing.assert_close(depthwise(conv, x, unfolded=True), conv(x), rtol=1e-5, atol=1e-5)
        assert depthwise(conv, x).equal(conv(x))  # on the CPU: the module itself
    hidden = torch.randn(3, 15, model.predictor.config.idim)
    torch.testing.assert_close(cif_weights(model.predictor, hidden, unfolded=True),
                               cif_weights(model.predictor, hidden), rtol=1e-5, atol=1e-6)


def test_pieces_of_any_length_decide_the_same_tokens(loaded) -> None:
    # The stream keeps what is short of a whole 600 ms step until more arrives, as FunASR's cache does.
    audio = clips()[0]
    whole = [t for ids in feed(loaded, audio, PIECE) for t in ids]
    for size in (1000, 4321, len(audio)):
        assert [t for ids in feed(loaded, audio, size) for t in ids] == whole


def test_transcribe_stream_gives_the_streams_tokens(loaded, capsys) -> None:
    assert main(["transcribe", *clip_paths(), "--model", str(MODEL), "--stream", "--device", "cpu",
                 "--output-format", "jsonl", "--quiet"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    expected = [[t for ids in feed(loaded, audio, PIECE) for t in ids] for audio in clips()]
    assert [row["token_ids"] for row in rows] == expected
    assert [row["text"] for row in rows] == [loaded.tokenizer.decode(ids) for ids in expected]


def test_whole_files_take_the_same_chunk_walk(loaded, capsys) -> None:
    # The first two clips end more than 60 ms past their last whole chunk: FunASR's last step reads those
    # frames, and so does the offline walk over the whole file's features.
    paths = clip_paths()[:2]
    assert main(["transcribe", *paths, "--model", str(MODEL), "--device", "cpu", "--output-format", "jsonl",
                 "--quiet"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [row["token_ids"] for row in rows] == [[t for ids in feed(loaded, audio, PIECE) for t in ids]
                                                  for audio in clips()[:2]]


def test_a_chunk_without_look_ahead_is_refused(capsys) -> None:
    assert main(["transcribe", clip_paths()[0], "--model", str(MODEL), "--stream", "--chunk-ms", "60",
                 "--device", "cpu", "--quiet"]) != 0
    assert "has no look-ahead" in capsys.readouterr().err


def test_audio_after_the_final_piece_is_refused(loaded) -> None:
    stream = ParaformerStream(loaded.model, loaded.features)
    stream.push(np.zeros(PIECE, dtype=np.float32), final=True)
    with pytest.raises(ValueError, match="after the stream's final piece"):
        stream.push(np.zeros(10, dtype=np.float32))


@pytest.mark.parametrize(("old", "new", "message"), [
    ("frontend: WavFrontendOnline", "frontend: WavFrontend",
     "field frontend is 'WavFrontend'; OASR's paraformer_streaming serves WavFrontendOnline"),
    ("input_layer: pe_online", "input_layer: pe", "field encoder_conf.input_layer is 'pe'; OASR serves 'pe_online'"),
    ("encoder: SANMEncoderChunkOpt", "encoder: SANMEncoder", "field encoder is 'SANMEncoder'"),
])
def test_a_streaming_folder_oasr_cannot_serve_is_refused_naming_the_field(old, new, message, tmp_path: Path,
                                                                        capsys) -> None:
    folder = tmp_path / "model"
    shutil.copytree(MODEL, folder)
    config = folder / "config.yaml"
    config.write_text(config.read_text().replace(old, new))
    assert main(["transcribe", clip_paths()[0], "--model", str(folder), "--stream", "--device", "cpu",
                 "--quiet"]) != 0
    assert message in capsys.readouterr().err


def test_chunk_settings_the_model_cannot_take_are_refused() -> None:
    from oasr.models.paraformer_streaming.config import ChunkConfig

    with pytest.raises(ValueError, match="look_back"):
        ChunkConfig((0, 10, 5), 0, 1)
    with pytest.raises(ValueError, match="chunk_size"):
        ChunkConfig((0, 10, 0), 4, 1)
