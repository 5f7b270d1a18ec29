"""Word timestamps from cross-attention: each step against openai-whisper's, and whole windows against its
``transcribe(word_timestamps=True)`` on the same weights (CPU, fp32, temperature 0)."""

from __future__ import annotations

import base64
import gzip

import numpy as np
import pytest
import torch

from oasr.audio import load_audio
from oasr.layers.cache import DenseCross, FullContext
from oasr.models.embedded import resolve_embedded
from oasr.models.whisper.alignment import (
    AlignmentRow,
    WordTimingOptions,
    _dtw_steps,
    _skew,
    align_words,
    dtw,
    median_filter,
    word_timings,
)
from oasr.models.whisper.alignment_probe import CrossAttentionProbe
from oasr.models.whisper.config import WhisperConfig, tiny_whisper_config
from oasr.models.whisper.words import TextSpan, WordTiming, merge_punctuation, split_words
from oasr.tokenizers.whisper import WhisperTokenizer
from oasr.vad.cuts import quiet_spans
from openai_whisper_reference import compare_word_timestamps, openai_whisper_from
from speech_data import audio_path, manifest_entries, require_speech_data

whisper = pytest.importorskip("whisper")

# Clips with punctuation, capitals, pauses and a sentence end; all under 12 s to keep the reference run short.
CLIP_IDS = ("whisper_jfk", "coqui_ljspeech_LJ001-0006", "picovoice_leopard_en", "ps_librivox_0870")


def tokenizer_of(name: str) -> WhisperTokenizer:
    return WhisperTokenizer(resolve_embedded(name).directory / "tokenizer.json")


# ------------------------------------------------------------------------------------------------ the pieces


def tied_costs(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Costs on a coarse grid, so that equal neighbours (the tie-breaking rules) occur often."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 4, (rows, cols), generator=generator).float() / 4


@pytest.mark.parametrize("shapes", [[(5, 9)], [(12, 40), (3, 70), (30, 31), (1, 1), (7, 2)]])
def test_batched_dtw_paths_equal_openai_whisper_dtw(shapes) -> None:
    from whisper.timing import dtw_cpu

    costs = [tied_costs(n, m, seed) for seed, (n, m) in enumerate(shapes)] + [torch.randn(20, 300)]
    ours = dtw(costs)
    for cost, (rows, cols) in zip(costs, ours, strict=True):
        ref_rows, ref_cols = dtw_cpu(cost.double().numpy())
        np.testing.assert_array_equal(rows, ref_rows)
        np.testing.assert_array_equal(cols, ref_cols)


def test_dtw_steps_are_the_same_in_torch_and_numpy() -> None:
    x = torch.stack([tied_costs(10, 50, 7), torch.randn(10, 50)])
    skewed = _skew(x)
    in_numpy = _dtw_steps(skewed.numpy(), np.full(skewed.shape, 2, dtype=np.int8), np)
    in_torch = _dtw_steps(skewed, torch.full(skewed.shape, 2, dtype=torch.int8), torch)
    np.testing.assert_array_equal(in_torch.numpy(), in_numpy)


@pytest.mark.gpu
def test_dtw_on_the_gpu_equals_dtw_on_cpu() -> None:
    costs = [tied_costs(30, 400, seed) for seed in range(3)] + [torch.randn(50, 1500)]
    on_gpu = dtw([c.cuda() for c in costs])
    for (rows, cols), (ref_rows, ref_cols) in zip(on_gpu, dtw(costs), strict=True):
        np.testing.assert_array_equal(rows, ref_rows)
        np.testing.assert_array_equal(cols, ref_cols)


def test_median_filter_equals_openai_whisper() -> None:
    from whisper.timing import median_filter as reference

    x = torch.randn(3, 5, 40)
    torch.testing.assert_close(median_filter(x, 7), reference(x, 7), rtol=0, atol=0)
    short = torch.randn(2, 2, 3)
    assert torch.equal(median_filter(short, 7), short)


@pytest.mark.parametrize(
    ("name", "language", "text"),
    [
        ("tiny.en", "en", " And so, my fellow Americans: ask not what your country can do for you!"),
        ("tiny.en", "en", ' "Well," she said — naïve café-goers (über-fans) ask? 42% of them.'),
        ("base", "de", " Grüße aus Köln, übermorgen früh."),
        ("base", "ja", "日本語の文章を、単語に分けます。"),
        ("base", "zh", "今天天气很好，我们去公园吧！"),
    ],
)
def test_tokens_group_into_the_words_openai_whisper_makes(name: str, language: str, text: str) -> None:
    from whisper.tokenizer import get_tokenizer

    ours = tokenizer_of(name)
    multilingual = name != "tiny.en"
    reference = get_tokenizer(multilingual, language=language if multilingual else None, task="transcribe")
    tokens = ours.encode(text) + [ours.special.eot]
    assert split_words(ours, tokens, language) == reference.split_to_word_tokens(tokens)


def test_punctuation_merges_like_openai_whisper() -> None:
    from whisper.timing import WordTiming as Reference
    from whisper.timing import merge_punctuations

    pieces = [' "', "Hello", ",", " (", "world", ")", ".", " ¿", "Que", "?", '"']
    ours = [WordTiming(p, [i], i * 0.1, i * 0.1 + 0.1, 0.5) for i, p in enumerate(pieces)]
    theirs = [Reference(p, [i], i * 0.1, i * 0.1 + 0.1, 0.5) for i, p in enumerate(pieces)]
    merge_punctuation(ours, '"\'“¿([{-', '"\'.。,，!！?？:：”)]}、')
    merge_punctuations(theirs, '"\'“¿([{-', '"\'.。,，!！?？:：”)]}、')
    assert [(w.word, w.tokens) for w in ours] == [(w.word, w.tokens) for w in theirs]
    assert [w.word for w in ours if w.word] == [' "Hello,', ' (world).', ' ¿Que?"']


# ------------------------------------------------------------------------------------- model and checkpoint


def test_alignment_heads_default_to_the_later_half_of_the_decoder() -> None:
    config = tiny_whisper_config()
    assert config.alignment_heads == ()
    assert config.word_alignment_heads == tuple((1, h) for h in range(4))
    with pytest.raises(ValueError, match="outside the decoder"):
        WhisperConfig.from_dict({**config.to_dict(), "alignment_heads": [[2, 0]]})


@pytest.mark.parametrize(("fixture", "openai_name"), [("tiny_en", "tiny.en"), ("base_multilingual", "base")])
def test_checkpoint_alignment_heads_are_openai_whispers(request, fixture: str, openai_name: str) -> None:
    loaded = request.getfixturevalue(fixture)
    mask = np.frombuffer(gzip.decompress(base64.b85decode(whisper._ALIGNMENT_HEADS[openai_name])), dtype=bool)
    c = loaded.config
    expected = tuple(tuple(int(v) for v in pair) for pair in np.argwhere(mask.reshape(c.decoder_layers, -1)))
    assert c.alignment_heads == expected


def test_native_format_keeps_alignment_heads(tiny_en, tmp_path) -> None:
    from oasr.models.converters.native import save_native
    from oasr.models.loader import from_pretrained

    native = from_pretrained(save_native(tiny_en.checkpoint, tmp_path / "native"), device="cpu", dtype="float32")
    assert native.config.alignment_heads == tiny_en.config.alignment_heads != ()


def test_probe_reads_openai_whispers_cross_attention_and_changes_nothing(tiny_en) -> None:
    from whisper.model import disable_sdpa

    model = tiny_en.model
    features = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([[50257, 50362, 400, 370, 452, 50256]])
    positions = torch.arange(tokens.shape[1])[None]
    heads = [(3, 1), (1, 0), (2, 5)]
    probe = CrossAttentionProbe(heads, "cpu")
    with torch.inference_mode():
        cross = DenseCross(*model.cross_kv(model.encode(features).hidden))
        plain = model.decode(tokens, positions, FullContext(), cross)
        probed = model.decode(tokens, positions, FullContext(), cross, probe)
    assert torch.equal(plain, probed)
    assert probe.heads == ((1, 0), (2, 5), (3, 1))

    reference = openai_whisper_from(tiny_en, tiny_en.checkpoint.state_dict)
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        block.cross_attn.register_forward_hook(lambda _m, _i, out, layer=layer: seen.__setitem__(layer, out[-1]))
        for layer, block in enumerate(reference.decoder.blocks)
    ]
    with torch.inference_mode(), disable_sdpa():
        reference(features, tokens)
    for hook in hooks:
        hook.remove()
    expected = torch.stack([seen[layer][0, head] for layer, head in probe.heads])[None]
    torch.testing.assert_close(probe.scores(), expected, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------- whole windows


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    require_speech_data()
    entries = {e["id"]: e for e in manifest_entries()}
    return [load_audio(audio_path(entries[i]), channel=entries[i].get("channel")) for i in CLIP_IDS]


@pytest.mark.slow
@pytest.mark.parametrize("timestamps", [True, False], ids=["timestamp_segments", "no_timestamps"])
def test_word_times_equal_openai_whisper_transcribe(tiny_en, clips, timestamps: bool) -> None:
    reference = openai_whisper_from(tiny_en, tiny_en.checkpoint.state_dict)
    comparisons: dict = {}
    for audio in clips[: 3 if timestamps else 2]:
        compare_word_timestamps(tiny_en, reference, audio, comparisons, timestamps=timestamps)
    same, own = comparisons["same_features"], comparisons["own_features"]
    print(f"\nsame features: {same.num_exact}/{same.num_words} exact; own features: "
          f"{own.num_within}/{own.num_words} within 0.1 s, {own.num_exact} exact")
    assert same.text_mismatches == []
    assert same.num_words >= (50 if timestamps else 30)
    # On openai-whisper's own features the same tokens give the same times, to the 10 ms they are rounded to.
    assert same.num_exact == same.num_words, sorted(same.worst, reverse=True)[:5]
    # On OASR's features (the window's audio zero-padded, not its features) attention moves a little.
    assert own.fraction_within >= 0.95, sorted(own.worst, reverse=True)[:5]


def test_batched_rows_equal_rows_one_at_a_time(tiny_en, clips) -> None:
    import oasr

    audio = clips[:3]
    decoded = oasr.transcribe(audio, tiny_en)
    features = tiny_en.features(audio)
    rows = [
        AlignmentRow(tuple(r.token_ids), len(a) // 160, language="en", time_offset=1.5 * i, last_speech_end=1.5 * i)
        for i, (r, a) in enumerate(zip(decoded, audio, strict=True))
    ]
    batched = word_timings(tiny_en.model, tiny_en.tokenizer, rows, features=features)
    alone = [word_timings(tiny_en.model, tiny_en.tokenizer, [row], features=features[i : i + 1])[0]
             for i, row in enumerate(rows)]
    assert [[(w.word, w.start, w.end) for w in ws] for ws in batched] == [
        [(w.word, w.start, w.end) for w in ws] for ws in alone
    ]
    for ws, p in zip(batched, alone, strict=True):
        np.testing.assert_allclose([w.probability for w in ws], [w.probability for w in p], rtol=1e-4)
    jfk = batched[0]
    assert "".join(w.word for w in jfk).strip() == decoded[0].text
    assert [w.word for w in jfk[:4]] == [" And", " so", " my", " fellow"]
    assert all(a.end <= b.start + 1e-9 for a, b in zip(jfk, jfk[1:])) and all(w.start <= w.end for w in jfk)
    assert 0.0 <= jfk[0].start < 1.0 and 9.0 < jfk[-1].end <= 11.0  # the clip is 11 s, speech ends near 10 s
    assert all(0 < w.probability <= 1 for w in jfk)
    # Chunking into passes of fewer rows gives the same words; a row without text costs nothing and has none.
    chunked = word_timings(tiny_en.model, tiny_en.tokenizer, rows, features=features,
                           options=WordTimingOptions(max_rows=2))
    assert [[w.word for w in ws] for ws in chunked] == [[w.word for w in ws] for ws in batched]
    empty = AlignmentRow((tiny_en.tokenizer.special.eot,), 3000)
    assert word_timings(tiny_en.model, tiny_en.tokenizer, [empty], features=features[:1]) == [[]]


def test_bad_inputs_are_refused(tiny_en) -> None:
    row = AlignmentRow((400, 370), 1000)
    features = torch.zeros(1, 80, 3000)
    with pytest.raises(ValueError, match="exactly one"):
        word_timings(tiny_en.model, tiny_en.tokenizer, [row])
    with pytest.raises(ValueError, match="2 rows"):
        word_timings(tiny_en.model, tiny_en.tokenizer, [row, row], features=features)
    with pytest.raises(ValueError, match="spans hold 1"):
        spans = (TextSpan(0.0, 1.0, 1),)
        align_words(tiny_en.model, tiny_en.tokenizer, [AlignmentRow((400, 370), 1000, spans=spans)], features=features)
    with pytest.raises(ValueError, match="odd"):
        WordTimingOptions(median_filter_width=4)


def test_transcribe_fills_segment_words_window_by_window(tiny_en, clips) -> None:
    import oasr

    jfk = clips[0]
    long = np.concatenate([jfk, jfk, jfk])  # 33 s: a full window and a 3 s one
    plain, worded = (oasr.transcribe(long, tiny_en, word_timestamps=w)[0] for w in (False, True))
    assert worded.text == plain.text and worded.token_ids == plain.token_ids
    assert all(s.words == () for s in plain.segments)
    assert len(worded.segments) == 2
    for segment in worded.segments:
        assert "".join(w.word for w in segment.words).strip() == segment.text
        assert all(segment.start <= w.start <= w.end <= segment.end + 0.02 for w in segment.words)
        assert all(a.end <= b.start + 1e-9 for a, b in zip(segment.words, segment.words[1:]))
    first, second = worded.segments
    assert first.words[0].word == " And" and first.words[0].start < 1.0
    (_, cut), _ = quiet_spans(long, 480_000)  # the first window ends at the quiet cut before 30 s
    assert second.words[0].start >= cut / 16_000
    # The words are what word_timings gives for the first window's tokens on their own (a window of a long input
    # decodes with timestamps and may be continued, so its tokens are not those of the 30 s decoded alone).
    window = long[:cut]
    row = AlignmentRow(first.token_ids, cut // 160, language="en")
    alone = word_timings(tiny_en.model, tiny_en.tokenizer, [row], features=tiny_en.features([window]))[0]
    assert [(w.word, w.start, w.end) for w in alone] == [(w.word, w.start, w.end) for w in first.words]
