"""Decode strategies of the CTC and transducer families on scripted inputs: the CTC prefix beam search against
brute force, and the transducer label loop's frame/duration rules (max symbols per frame, TDT durations)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.ctc_greedy import greedy_ids
from oasr.decode.ctc_prefix_beam import prefix_beam_search
from oasr.decode.transducer_greedy import TransducerGreedyOptions
from oasr.models.base import EncoderOutput


def ctc_log_likelihood(log_probs: torch.Tensor, length: int, labels: tuple[int, ...], blank: int) -> float:
    loss = F.ctc_loss(log_probs[:length, None], torch.tensor([labels], dtype=torch.long), torch.tensor([length]),
                      torch.tensor([len(labels)]), blank=blank, reduction="none")
    return -loss.item()


def test_wide_prefix_beam_search_finds_the_most_likely_sequence() -> None:
    """With a beam wider than every prefix there is, nothing is pruned: the search is exact."""
    blank, num_labels, num_frames = 2, 2, 5
    log_probs = torch.randn(3, num_frames, num_labels + 1, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
    lengths = torch.tensor([5, 3, 4])
    ids, scores = prefix_beam_search(log_probs, lengths, blank, beam_size=2 ** (num_frames + 1))
    for row, length in enumerate(lengths.tolist()):
        candidates = [seq for n in range(length + 1) for seq in itertools.product(range(num_labels), repeat=n)]
        best = max(candidates, key=lambda seq: ctc_log_likelihood(log_probs[row], length, seq, blank))
        assert ids[row] == list(best)
        assert scores[row].item() == pytest.approx(ctc_log_likelihood(log_probs[row], length, best, blank), abs=1e-4)


def test_prefix_beam_merges_paths_that_greedy_cannot() -> None:
    """Best path 'blank' everywhere, but the label 0 gathers more mass over its many alignments."""
    frame = torch.tensor([0.4, 0.0, 0.6]).clamp(min=1e-6).log()  # labels 0, 1 and blank 2
    log_probs = frame.expand(1, 3, 3).contiguous()
    lengths = torch.tensor([3])
    assert greedy_ids(log_probs, lengths, blank_id=2) == [[]]
    ids, _ = prefix_beam_search(log_probs, lengths, blank_id=2, beam_size=4)
    assert ids == [[0]]


class ScriptedTransducer:
    """A transducer whose joint reads its answer from a script keyed by (row, frame, tokens emitted so far).

    Frames carry their index, the predictor's state and output carry the count of emitted tokens, so the script
    also checks that the loop keeps the predictor state only on rows that emitted.
    """

    blank_id = 9
    vocab_size = 10
    max_symbols_per_step = 3

    def __init__(self, script: dict[tuple[int, int, int], tuple[int, int]], durations: tuple[int, ...] = ()) -> None:
        self.script = script  # (row, frame, emitted) -> (token, duration index); missing: blank, duration 1
        self.durations = durations

    def project_encoder(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def predictor_init(self, batch_size: int, device: torch.device):
        count = torch.zeros(batch_size, dtype=torch.long, device=device)
        return count[:, None].float(), count

    def predictor_step(self, tokens: torch.Tensor, state: torch.Tensor):
        return (state + 1)[:, None].float(), state + 1

    def predictor_select(self, keep_new: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        return torch.where(keep_new, new, old)

    def joint(self, frames: torch.Tensor, predictor_out: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(frames.shape[0], self.vocab_size + len(self.durations))
        for row, (frame, emitted) in enumerate(zip(frames[:, 1].tolist(), predictor_out[:, 0].tolist())):
            token, duration = self.script.get((row, int(frame), int(emitted)), (self.blank_id, 1))
            logits[row, token] = 1.0
            if self.durations:
                logits[row, self.vocab_size + duration] = 1.0
        return logits


def frames(lengths: list[int]) -> EncoderOutput:
    """hidden [B, T, 2] whose second channel is the frame index (the first is the row)."""
    t = max(lengths)
    hidden = torch.stack([torch.stack([torch.full((t,), float(b)), torch.arange(t).float()], -1)
                          for b in range(len(lengths))])
    return EncoderOutput(hidden=hidden, lengths=torch.tensor(lengths))


def test_rnnt_stays_on_a_frame_until_blank_and_is_forced_on_after_max_symbols() -> None:
    def script(max_symbols: int) -> dict[tuple[int, int, int], tuple[int, int]]:
        return {
            (0, 0, 0): (4, 0), (0, 0, 1): (5, 0),  # two tokens, then blank on frame 0
            (0, 2, 2): (6, 0),  # frame 1 blank, one token on frame 2
            **{(1, 0, u): (7, 0) for u in range(10)},  # never blank on frame 0: forced on after max_symbols
            (1, 1, max_symbols): (8, 0),  # one token on frame 1
        }  # fmt: skip

    greedy = DECODE_STRATEGIES.get("transducer_greedy")
    assert greedy().decode(ScriptedTransducer(script(3)), frames([3, 2])) == [[4, 5, 6], [7, 7, 7, 8]]
    two = greedy(TransducerGreedyOptions(max_symbols_per_step=2))
    assert two.decode(ScriptedTransducer(script(2)), frames([3, 2])) == [[4, 5, 6], [7, 7, 8]]


def test_tdt_advances_by_predicted_durations() -> None:
    durations = (0, 1, 2, 4)
    script = {
        (0, 0, 0): (1, 0),  # token, duration 0: stay on frame 0
        (0, 0, 1): (2, 2),  # token, duration 2: to frame 2
        (0, 2, 2): (9, 0),  # blank predicting 0 frames: moves 1 anyway
        (0, 3, 2): (3, 3),  # token, duration 4 (index 3): past the end of 5 frames
        (1, 0, 0): (9, 3),  # blank, 4 frames
        (1, 4, 0): (5, 1),
        **{(2, 0, u): (6, 0) for u in range(10)},  # zero-duration tokens forever: forced on after 3
    }  # fmt: skip
    model = ScriptedTransducer(script, durations)
    ids = DECODE_STRATEGIES.get("tdt_greedy")().decode(model, frames([5, 5, 1]))
    assert ids == [[1, 2, 3], [5], [6, 6, 6]]
