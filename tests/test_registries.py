"""Registries and the layer waist: every entry resolves, every architecture builds from its tiny config out of
``oasr.layers`` only, and the kernel backend declares its gaps."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from oasr.decode import DECODE_STRATEGIES
from oasr.features import FEATURE_EXTRACTORS
from oasr.layers import apply_backend, kernel_gaps
from oasr.models import ARCHITECTURES, CONVERTERS
from oasr.engine.runners import RUNNERS
from oasr.models.capabilities import capabilities_of
from oasr.models.frame_sync import FrameSyncModel
from oasr.quantization import QUANT_METHODS
from oasr.registry import Registry, UnknownEntryError
from oasr.tokenizers import TOKENIZERS

# torch modules that only hold other modules; everything with parameters or compute must come from oasr.layers.
CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


@pytest.mark.parametrize("name", ARCHITECTURES.names())
def test_every_architecture_has_a_tiny_config_that_builds_and_runs(name: str) -> None:
    arch = ARCHITECTURES.get(name)
    assert hasattr(arch, "tiny_config"), f"architecture {name} has no tiny_config()"
    config = arch.tiny_config()
    model = arch.from_config(config).eval()
    assert arch.feature_extractor in FEATURE_EXTRACTORS
    assert arch.tokenizer in TOKENIZERS
    with torch.inference_mode():
        out = model(*arch.example_inputs(config, batch_size=2))
    assert out.shape[0] == 2
    assert torch.isfinite(out).all()
    capabilities = capabilities_of(arch)
    assert capabilities.runner in RUNNERS
    for strategy in capabilities.decode_strategies:
        assert DECODE_STRATEGIES.get(strategy).runner == capabilities.runner, (name, strategy)


@pytest.mark.parametrize("name", ARCHITECTURES.names())
def test_models_are_built_from_the_layer_waist_only(name: str) -> None:
    arch = ARCHITECTURES.get(name)
    model = arch.from_config(arch.tiny_config())
    bare = sorted(
        {
            f"{path}: {type(module).__module__}.{type(module).__name__}"
            for path, module in model.named_modules()
            if type(module).__module__.startswith("torch.") and not isinstance(module, CONTAINERS)
        }
    )
    assert bare == []
    foreign = [
        path
        for path, module in model.named_modules()
        if not type(module).__module__.startswith(("oasr.layers", "oasr.models", "torch.nn.modules.container"))
    ]
    assert foreign == []


def test_kernels_backend_reports_its_gaps_instead_of_falling_back_silently(caplog) -> None:
    caplog.set_level(logging.INFO, logger="oasr.layers.backend")
    arch = ARCHITECTURES.get("whisper")
    model = arch.from_config(arch.tiny_config())
    assert apply_backend(model, "torch") == []
    gaps = apply_backend(model, "kernels")
    assert {g.op for g in gaps} == {"linear", "layer_norm", "conv1d", "embedding", "gelu", "attention"}
    assert {"lstm", "rel_pos_attention"} <= {g.op for g in kernel_gaps()}
    assert "no kernel yet" in caplog.text
    assert all(g.reason for g in kernel_gaps())
    with pytest.raises(ValueError, match="unknown layer backend"):
        apply_backend(model, "cuda-magic")


@pytest.mark.parametrize("registry", [ARCHITECTURES, CONVERTERS, FEATURE_EXTRACTORS, TOKENIZERS, DECODE_STRATEGIES,
                                      RUNNERS, QUANT_METHODS])
def test_every_lazy_entry_resolves(registry: Registry) -> None:
    assert registry.names()
    for name in registry.names():
        assert registry.get(name) is not None


def test_every_registered_decode_strategy_is_reachable_from_an_architecture() -> None:
    reachable = {s for _, arch in ARCHITECTURES.items() for s in capabilities_of(arch).decode_strategies}
    assert set(DECODE_STRATEGIES.names()) - reachable == set()


def test_every_runner_kind_serves_an_architecture() -> None:
    served = {capabilities_of(arch).runner for _, arch in ARCHITECTURES.items()}
    assert set(RUNNERS.names()) == served


def test_every_frame_synchronous_architecture_has_the_prompt_seam() -> None:
    """The frame runner calls ``prompt_id`` and ``fuse_prompt`` on every model it serves, without probing."""
    frame_sync = [name for name, arch in ARCHITECTURES.items() if capabilities_of(arch).runner == "frame_sync"]
    assert {"parakeet_ctc", "parakeet_rnnt", "nemotron3_5_asr"} <= set(frame_sync)
    assert [name for name in frame_sync if not issubclass(ARCHITECTURES.get(name), FrameSyncModel)] == []


def test_a_searching_strategy_is_what_serves_beam_size() -> None:
    beams = {name: capabilities_of(arch).beam_strategy for name, arch in ARCHITECTURES.items()}
    assert beams["whisper"] == "aed_beam" and beams["parakeet_ctc"] == "ctc_prefix_beam"
    for strategy in filter(None, beams.values()):
        assert DECODE_STRATEGIES.get(strategy).searches


def test_unknown_entry_names_the_registered_ones() -> None:
    with pytest.raises(UnknownEntryError, match="whisper"):
        ARCHITECTURES.get("wav2vec9")


def test_registering_a_different_object_twice_is_an_error() -> None:
    registry: Registry[type] = Registry("thing")
    registry.register("a")(int)
    registry.register("a")(int)
    with pytest.raises(ValueError, match="twice"):
        registry.register("a")(str)
