"""FastConformer (Parakeet) CTC / RNN-T / TDT against transformers' reference classes: tiny random weights saved
with ``save_pretrained``, loaded through ``oasr.models.loader``; on CPU fp32 the encoder output and the greedy
tokens must equal the reference's for a batch of different lengths, and padding must not change any row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from oasr.decode import DECODE_STRATEGIES
from oasr.models.capabilities import capabilities_of
from oasr.decode.ctc_prefix_beam import CTCPrefixBeamOptions, prefix_beam_search
from oasr.models import ARCHITECTURES
from oasr.models.converters.native import save_native
from oasr.models.loader import LoadedModel, from_pretrained, read_checkpoint, resolve_source
from parakeet_reference import (
    KINDS,
    build_reference,
    features,
    reference_greedy,
    reference_tokenizer,
    write_tokenizer,
)

TOLERANCE = 1e-4


@dataclass
class Pair:
    kind: str
    reference: torch.nn.Module
    loaded: LoadedModel
    tokenizer_file: Path
    special: str
    x: torch.Tensor  # [B, T, n_mels], the reference's layout
    lengths: torch.Tensor

    @property
    def ours(self) -> torch.Tensor:
        return self.x.transpose(1, 2)  # OASR's extractor layout [B, n_mels, T]


@pytest.fixture(scope="module", params=KINDS)
def pair(request, tmp_path_factory) -> Pair:
    kind = request.param
    directory = tmp_path_factory.mktemp(f"parakeet_{kind}")
    reference = build_reference(kind)
    reference.save_pretrained(directory)
    special = "<pad>" if kind == "ctc" else "<blank>"
    write_tokenizer(directory / "tokenizer.json", special)
    loaded = from_pretrained(directory, device="cpu", dtype="float32")
    x, lengths = features(reference.config.encoder_config.num_mel_bins)
    return Pair(kind, reference, loaded, directory / "tokenizer.json", special, x, lengths)


def greedy(loaded: LoadedModel, features_: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    strategy = DECODE_STRATEGIES.get(capabilities_of(type(loaded.model)).default_strategy)()
    with torch.inference_mode():
        return strategy.decode(loaded.model, loaded.model.encode(features_, lengths))


def test_checkpoint_loads_key_for_key(pair: Pair) -> None:
    assert pair.loaded.architecture == f"parakeet_{pair.kind}" and pair.loaded.format == "huggingface"
    ours = pair.loaded.model.state_dict()
    theirs = pair.reference.state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_config_runs_forward_on_its_example_inputs(kind: str) -> None:
    arch = ARCHITECTURES.get(f"parakeet_{kind}")
    config = arch.tiny_config()
    model = arch.from_config(config).eval()
    features_, lengths = arch.example_inputs(config, batch_size=3)
    with torch.inference_mode():
        out = model(features_, lengths)
    assert out.shape[0] == 3 and out.shape[-1] == config.vocab_size + len(getattr(config, "durations", ()))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("packed", [True, False])
def test_encoder_output_of_each_row_does_not_depend_on_the_batch_padding(packed: bool, monkeypatch) -> None:
    """Odd and even lengths, a one-frame row and a full-length one: the subsampling zeroes only the padded frames
    its convolutions read, so every row's real frames must equal the row encoded alone, whether the layers run
    on the padded batch or on its packed real frames."""
    from oasr.models.fastconformer.config import FastConformerEncoderConfig
    from oasr.models.fastconformer.encoder import FastConformerEncoder, frame_mask

    torch.manual_seed(0)
    config = FastConformerEncoderConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64,
                                        num_hidden_layers=2, num_mel_bins=16, subsampling_conv_channels=8)
    encoder = FastConformerEncoder(config).eval()
    for parameter in encoder.parameters():  # large random weights: a leaked padded frame would show
        torch.nn.init.normal_(parameter, std=0.3)
    lengths = torch.tensor([97, 64, 33, 120, 119, 1, 8, 9])
    monkeypatch.setattr(FastConformerEncoder, "pack_from_padding", 0.0 if packed else 2.0)
    encoded = encoder.output_lengths(lengths)
    assert encoder.layout(lengths.tolist(), encoded, int(encoded.max())).is_packed == packed
    x = torch.randn(len(lengths), 16, 120) * frame_mask(lengths, 120)[:, None, :]
    with torch.inference_mode():
        batched = encoder(x, lengths)
        for row, length in enumerate(lengths.tolist()):
            alone = encoder(x[row : row + 1, :, :length], lengths[row : row + 1])
            frames = int(alone.lengths[0])
            assert frames == int(batched.lengths[row])
            torch.testing.assert_close(batched.hidden[row, :frames], alone.hidden[0, :frames], atol=1e-5, rtol=0)


def test_packed_and_padded_layers_give_the_same_real_frames(pair: Pair, monkeypatch) -> None:
    from oasr.models.fastconformer.encoder import FastConformerEncoder

    with torch.inference_mode():
        packed = pair.loaded.model.encode(pair.ours, pair.lengths)  # host lengths, a third padding: packed
        monkeypatch.setattr(FastConformerEncoder, "pack_from_padding", 2.0)
        padded = pair.loaded.model.encode(pair.ours, pair.lengths)
    real = torch.arange(padded.hidden.shape[1])[None] < padded.lengths[:, None]
    assert torch.equal(packed.lengths, padded.lengths)
    torch.testing.assert_close(packed.hidden[real], padded.hidden[real], atol=1e-5, rtol=0)


def test_native_round_trip_keeps_the_encoder_output(pair: Pair, tmp_path: Path) -> None:
    checkpoint = read_checkpoint(resolve_source(pair.tokenizer_file.parent))
    native = from_pretrained(save_native(checkpoint, tmp_path), device="cpu", dtype="float32")
    assert native.format == "native" and native.config == pair.loaded.config
    with torch.inference_mode():
        ours = native.model.encode(pair.ours, pair.lengths).hidden
        expected = pair.loaded.model.encode(pair.ours, pair.lengths).hidden
    assert torch.equal(ours, expected)


def test_encoder_matches_transformers_on_real_frames(pair: Pair) -> None:
    mask = (torch.arange(pair.x.shape[1])[None] < pair.lengths[:, None]).long()
    with torch.inference_mode():
        out = pair.loaded.model.encode(pair.ours, pair.lengths)
        expected = pair.reference.encoder(input_features=pair.x, attention_mask=mask)
    real = expected.attention_mask.bool()
    assert out.lengths.tolist() == real.sum(-1).tolist() == [20, 13, 6]
    assert out.hidden.shape == expected.last_hidden_state.shape
    assert (out.hidden - expected.last_hidden_state)[real].abs().max().item() <= TOLERANCE
    if pair.kind != "ctc":
        with torch.inference_mode():
            projected = pair.loaded.model.project_encoder(out.hidden)
            expected_projected = pair.reference.encoder_projector(expected.last_hidden_state)
        assert (projected - expected_projected)[real].abs().max().item() <= TOLERANCE


def test_greedy_tokens_equal_transformers_decoding(pair: Pair) -> None:
    expected = reference_greedy(pair.kind, pair.reference, pair.x, pair.lengths)
    assert greedy(pair.loaded, pair.ours, pair.lengths) == expected.ids
    # The reference output is varied, so this comparison can fail: tokens on every row, several distinct ones,
    # and (transducers) blank steps beside token steps, (TDT) several durations.
    assert all(expected.ids) and len({t for row in expected.ids for t in row}) >= 3
    if pair.kind != "ctc":
        blank = pair.loaded.model.blank_id
        assert any(t == blank for row in expected.steps for t in row)
    if pair.kind == "tdt":
        assert len({d for row in expected.durations for d in row}) >= 3


def test_each_row_decoded_alone_equals_its_batched_result(pair: Pair) -> None:
    batched = greedy(pair.loaded, pair.ours, pair.lengths)
    for row, length in enumerate(pair.lengths.tolist()):
        alone = greedy(pair.loaded, pair.ours[row : row + 1, :, :length], pair.lengths[row : row + 1])
        assert alone == [batched[row]]


def test_text_matches_the_transformers_tokenizer(pair: Pair) -> None:
    reference = reference_greedy(pair.kind, pair.reference, pair.x, pair.lengths)
    theirs = reference_tokenizer(pair.tokenizer_file, pair.special)
    ours = greedy(pair.loaded, pair.ours, pair.lengths)
    for row, ids in enumerate(ours):
        if pair.kind == "ctc":  # the processor decodes CTC frames: repeats grouped, blank dropped
            expected = theirs.decode(reference.sequences[row], skip_special_tokens=True, group_tokens=True)
        else:
            expected = theirs.decode(reference.ids[row], skip_special_tokens=True, group_tokens=False)
        assert pair.loaded.tokenizer.decode(ids) == expected
        assert expected.strip()
    assert pair.loaded.tokenizer.decode(pair.loaded.tokenizer.encode("the cat is on")) == "the cat is on"


def ctc_score(log_probs: torch.Tensor, length: int, labels: list[int], blank: int) -> float:
    """log p(labels | frames) under CTC, summed over all alignments. log_probs: [T, V]."""
    loss = F.ctc_loss(
        log_probs[:length, None], torch.tensor([labels], dtype=torch.long), torch.tensor([length]),
        torch.tensor([len(labels)]), blank=blank, reduction="none",
    )
    return -loss.item()


@pytest.fixture(scope="module")
def ctc_pair(tmp_path_factory) -> Pair:
    directory = tmp_path_factory.mktemp("parakeet_ctc_beam")
    reference = build_reference("ctc")
    reference.save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<pad>")
    x, lengths = features(reference.config.encoder_config.num_mel_bins, seed=1)
    return Pair("ctc", reference, from_pretrained(directory, device="cpu", dtype="float32"),
                directory / "tokenizer.json", "<pad>", x, lengths)


def test_ctc_prefix_beam_of_one_is_greedy(ctc_pair: Pair) -> None:
    model = ctc_pair.loaded.model
    with torch.inference_mode():
        out = model.encode(ctc_pair.ours, ctc_pair.lengths)
    beam = DECODE_STRATEGIES.get("ctc_prefix_beam")(CTCPrefixBeamOptions(beam_size=1))
    assert beam.decode(model, out) == DECODE_STRATEGIES.get("ctc_greedy")().decode(model, out)


def test_ctc_prefix_beam_finds_a_sequence_at_least_as_likely_as_greedy(ctc_pair: Pair) -> None:
    model = ctc_pair.loaded.model
    with torch.inference_mode():
        out = model.encode(ctc_pair.ours, ctc_pair.lengths)
        log_probs = model.ctc_log_probs(out.hidden)
    greedy_ids = DECODE_STRATEGIES.get("ctc_greedy")().decode(model, out)
    beam_ids = DECODE_STRATEGIES.get("ctc_prefix_beam")(CTCPrefixBeamOptions(beam_size=4)).decode(model, out)
    _, beam_scores = prefix_beam_search(log_probs, out.lengths, model.blank_id, 4)
    for row, length in enumerate(out.lengths.tolist()):
        greedy_score = ctc_score(log_probs[row], length, greedy_ids[row], model.blank_id)
        beam_score = ctc_score(log_probs[row], length, beam_ids[row], model.blank_id)
        assert beam_score >= greedy_score - 1e-5
        # The beam's prefix score sums the alignments it kept: a lower bound of the sequence's likelihood.
        assert beam_scores[row].item() <= beam_score + 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_encoder_and_decoding_agree_with_cpu(kind: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # fp32 convolutions, not TF32
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    reference = build_reference(kind)
    reference.save_pretrained(tmp_path)
    write_tokenizer(tmp_path / "tokenizer.json", "<pad>" if kind == "ctc" else "<blank>")
    cpu = from_pretrained(tmp_path, device="cpu", dtype="float32")
    cuda = from_pretrained(tmp_path, device="cuda", dtype="float32")
    x, lengths = features(reference.config.encoder_config.num_mel_bins)
    with torch.inference_mode():
        cpu_out = cpu.model.encode(x.transpose(1, 2), lengths)
        cuda_out = cuda.model.encode(x.transpose(1, 2).cuda(), lengths.cuda())
    real = torch.arange(cpu_out.hidden.shape[1])[None] < cpu_out.lengths[:, None]
    assert (cuda_out.hidden.cpu() - cpu_out.hidden)[real].abs().max().item() <= 1e-3
    names = {"ctc": ["ctc_greedy", "ctc_prefix_beam"], "rnnt": ["transducer_greedy"], "tdt": ["tdt_greedy"]}[kind]
    for name in names:
        strategy = DECODE_STRATEGIES.get(name)()
        with torch.inference_mode():
            assert strategy.decode(cuda.model, cuda_out) == strategy.decode(cpu.model, cpu_out), name


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_graphed_label_loop_gives_the_eager_tokens(kind: str, tmp_path: Path) -> None:
    """The captured label loop, over batches that hit one (rows, frames) bucket twice and then a new one."""
    reference = build_reference(kind)
    reference.save_pretrained(tmp_path)
    write_tokenizer(tmp_path / "tokenizer.json", "<blank>")
    cuda = from_pretrained(tmp_path, device="cuda", dtype="float32")
    name = {"rnnt": "transducer_greedy", "tdt": "tdt_greedy"}[kind]
    eager, graphed = DECODE_STRATEGIES.get(name)(), DECODE_STRATEGIES.get(name)(cuda_graphs=True)
    x, lengths = features(reference.config.encoder_config.num_mel_bins)
    with torch.inference_mode():
        out = cuda.model.encode(x.transpose(1, 2).cuda(), lengths.cuda())
        batch = out.hidden.shape[0]
        for rows in (list(range(batch)), list(reversed(range(batch))), [0]):
            part = type(out)(hidden=out.hidden[rows], lengths=out.lengths[rows])
            expected = eager.decode(cuda.model, part)
            assert any(expected), "random weights emitted nothing: the comparison would be vacuous"
            assert graphed.decode(cuda.model, part) == expected
