"""Contracts are types: the registries check what registers against its protocol, and the runners check the model
they are handed, each naming every member that is missing; the capability record names a registered aligner."""

from __future__ import annotations

from typing import Protocol

import pytest
import torch

from oasr.engine.autoregressive import AutoregressiveRunner
from oasr.engine.config import EngineConfig
from oasr.engine.contracts import AutoregressiveModel, FrameSynchronousModel, Runner
from oasr.engine.frame_runner import FrameSyncRunner
from oasr.engine.runners import RUNNERS
from oasr.models import ARCHITECTURES
from oasr.models.aligners import WORD_ALIGNERS, WordAligner
from oasr.models.capabilities import ModelCapabilities, capabilities_of
from oasr.models.loader import LoadedModel
from oasr.registry import ContractError, Registry, conform, missing_members, protocol_members
from oasr.streaming import STREAMING_RUNTIMES
from oasr.streaming.runtime import StreamingRuntime


class _Sized(Protocol):
    size: int

    def grow(self) -> None: ...

    @property
    def area(self) -> int: ...


def test_protocol_members_are_its_attributes_methods_and_properties() -> None:
    assert protocol_members(_Sized) == ("area", "grow", "size")


def test_a_class_provides_an_instance_attribute_by_declaring_it() -> None:
    class Declared:
        size: int  # set in __init__

        def grow(self) -> None: ...

        area = 0

    class Bare:
        def grow(self) -> None: ...

    assert missing_members(Declared, _Sized) == []
    assert missing_members(Bare, _Sized) == ["area", "size"]
    with pytest.raises(ContractError, match="Bare lacks area, size|lacks area, size"):
        conform(Bare, _Sized, "Bare")


def test_the_registries_check_their_protocols() -> None:
    assert RUNNERS.contract is Runner
    assert STREAMING_RUNTIMES.contract is StreamingRuntime
    for _, runner in RUNNERS.items():
        assert missing_members(runner, Runner) == []
    for _, runtime in STREAMING_RUNTIMES.items():
        assert missing_members(runtime, StreamingRuntime) == []


def test_registering_a_runner_that_lacks_the_protocol_fails_naming_what_it_lacks() -> None:
    class HalfRunner:
        incremental = False
        overlaps_steps = False

        def execute(self, out, requests): ...

    with pytest.raises(ContractError) as error:
        RUNNERS.register("half")(HalfRunner)
    message = str(error.value)
    assert "runner kind 'half'" in message and "Runner" in message
    for member in ("block_pool", "check", "end_token", "num_slots", "output_language", "prompt_len_for"):
        assert member in message
    assert "execute" not in message.split("lacks", 1)[1]
    assert "half" not in RUNNERS


def test_registering_a_streaming_runtime_that_lacks_the_protocol_fails() -> None:
    runtimes = Registry("streaming runtime", contract=StreamingRuntime)

    class NoSteps:
        default_lookahead = 0
        sample_rate = 16_000
        frame_seconds = 0.08

    with pytest.raises(ContractError, match="lacks geometry, new_audio, open, reset_decoder, step, warm_up"):
        runtimes.register("no_steps")(NoSteps)
    assert "no_steps" not in runtimes


def test_every_architecture_provides_the_model_protocol_of_its_runner() -> None:
    contracts = {"autoregressive": AutoregressiveModel, "frame_sync": FrameSynchronousModel}
    for name, arch in ARCHITECTURES.items():
        assert missing_members(arch, contracts[capabilities_of(arch).runner]) == [], name


def _loaded(model: torch.nn.Module) -> LoadedModel:
    return LoadedModel(name="stub", architecture="stub", format="native", config=None, model=model, tokenizer=None,
                       features=None, device=torch.device("cpu"), dtype=torch.float32, kernel_gaps=[])


def test_a_runner_refuses_a_model_that_lacks_its_protocol_when_built() -> None:
    class EncoderOnly(torch.nn.Module):
        def encode(self, features, lengths): ...

    with pytest.raises(ContractError, match="lacks decode_hidden, decoder_spec, logits, prompt_builder"):
        AutoregressiveRunner(_loaded(EncoderOnly()), EngineConfig())
    with pytest.raises(ContractError, match="FrameSynchronousModel requires: it lacks encode_prompted, fuse_prompt, output_language, prompt_id"):
        FrameSyncRunner(_loaded(EncoderOnly()), EngineConfig())


def test_the_capability_record_names_a_registered_word_aligner() -> None:
    assert WORD_ALIGNERS.contract is WordAligner
    timed = {name: capabilities_of(arch) for name, arch in ARCHITECTURES.items() if capabilities_of(arch).word_timing}
    assert "whisper" in timed
    for name, record in timed.items():
        assert missing_members(WORD_ALIGNERS.get(record.aligner), WordAligner) == [], name
    assert "sequential" in capabilities_of(ARCHITECTURES.get("whisper")).long_form
    assert capabilities_of(ARCHITECTURES.get("parakeet_ctc")).long_form == ("parallel",)


def test_a_record_that_times_words_must_name_its_aligner() -> None:
    with pytest.raises(ValueError, match="word_timing and aligner go together"):
        ModelCapabilities(runner="frame_sync", decode_strategies=("ctc_greedy",), word_timing=True)
    with pytest.raises(ValueError, match="long_form must include parallel"):
        ModelCapabilities(runner="frame_sync", decode_strategies=("ctc_greedy",), long_form=("sequential",))
