"""Frame-synchronous steps overlap on CUDA: a step's result is read after the next step is queued.

The engine logic is the same on every device, so these tests switch the overlap on for a CPU runner (where a
launch computes everything before it returns) and check what callers see: the same tokens, outputs one step
later, and requests that stay accounted for while their step is in flight.
"""

from __future__ import annotations

import pytest
import torch

from oasr.audio import load_audio
from oasr.decode import DECODE_STRATEGIES
from oasr.decode.ctc_greedy import greedy_ids
from oasr.engine.config import EngineConfig, SchedulerConfig
from oasr.engine.engine import ASREngine
from oasr.models.loader import from_pretrained
from oasr.types import DecodeOptions
from parakeet_reference import build_reference, write_tokenizer
from test_fastconformer_engine import JFK, direct_decode


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    directory = tmp_path_factory.mktemp("overlap_ctc")
    build_reference("ctc").save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<pad>")
    return from_pretrained(directory, device="cpu", dtype="float32")


def overlapping_engine(loaded, rows: int = 2) -> ASREngine:
    engine = ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(max_encode_rows=rows)))
    assert not engine.runner.overlaps_steps  # on CPU a launch cannot run ahead of the host
    engine.runner.overlaps_steps = True
    return engine


def clips() -> dict[str, object]:
    full = load_audio(JFK)
    return {f"r{i}": full[: 16000 * s] for i, s in enumerate([3, 9, 1, 7, 2, 10, 5])}


def test_overlapped_run_gives_each_request_its_own_tokens(loaded) -> None:
    audio = clips()
    expected = direct_decode(loaded, list(audio.values()))
    assert any(expected), "the random model emits nothing: the comparison could not fail"
    engine = overlapping_engine(loaded)
    results = {o.request_id: o.token_ids for o in engine.run((k, a, DecodeOptions()) for k, a in audio.items())}
    assert [results[k] for k in audio] == expected
    assert not engine.has_unfinished()


def test_a_step_returns_the_outputs_of_the_step_before(loaded) -> None:
    audio = list(clips().values())
    engine = overlapping_engine(loaded, rows=2)
    for i, samples in enumerate(audio[:3]):
        engine.add_request(samples, request_id=f"r{i}")
    assert engine.step() == []  # r0, r1 launched
    assert engine.stats().num_running == 2 and engine.stats().num_waiting == 1
    first = engine.step()  # r2 launched; r0, r1 read
    assert sorted(o.request_id for o in first) == ["r0", "r1"] and all(o.finished for o in first)
    assert engine.has_unfinished() and engine.stats().num_running == 1
    last = engine.step()  # nothing to launch; r2 read
    assert [o.request_id for o in last] == ["r2"]
    assert not engine.has_unfinished() and engine.stats().num_running == 0
    assert [o.token_ids for o in first + last] == direct_decode(loaded, audio[:3])


def test_a_request_aborted_in_flight_is_not_reported_and_its_id_waits_for_its_step(loaded) -> None:
    audio = list(clips().values())
    engine = overlapping_engine(loaded, rows=2)
    engine.add_request(audio[0], request_id="a")
    engine.add_request(audio[1], request_id="b")
    assert engine.step() == []
    aborted = engine.abort("a")
    assert aborted is not None and aborted.finished and aborted.finish_reason.value == "aborted"
    with pytest.raises(ValueError, match="still in use"):
        engine.add_request(audio[2], request_id="a")
    outputs = engine.step()
    assert [o.request_id for o in outputs] == ["b"]
    engine.add_request(audio[2], request_id="a")  # its step has been read: the id is free again
    results = [o for _ in range(3) for o in engine.step()]
    assert [(o.request_id, o.token_ids) for o in results] == [("a", direct_decode(loaded, [audio[2]])[0])]


def test_launch_then_wait_equals_decode() -> None:
    torch.manual_seed(0)
    log_probs = torch.randn(3, 11, 5).log_softmax(-1)
    lengths = torch.tensor([11, 4, 0])
    strategy = DECODE_STRATEGIES.get("ctc_greedy")()

    class Head:
        blank_id = 4

        def ctc_log_probs(self, hidden):
            return hidden

    from oasr.models.base import EncoderOutput

    out = EncoderOutput(hidden=log_probs, lengths=lengths)
    launched = strategy.launch(Head(), out).wait()
    assert launched == strategy.decode(Head(), out) == greedy_ids(log_probs, lengths, 4)
    assert launched[2] == [] and len(launched[1]) <= 4
    labels = log_probs.argmax(-1)[0].tolist()
    collapsed = [t for i, t in enumerate(labels) if t != 4 and (i == 0 or labels[i - 1] != t)]
    assert launched[0] == collapsed
