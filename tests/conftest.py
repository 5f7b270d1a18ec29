from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_en():
    """tiny.en on CPU in fp32, with the converted checkpoint kept for building the reference model."""
    from oasr.models.loader import from_pretrained

    return from_pretrained("tiny.en", device="cpu", dtype="float32", keep_checkpoint=True)


@pytest.fixture(scope="session")
def base_multilingual():
    from oasr.models.loader import from_pretrained

    return from_pretrained("base", device="cpu", dtype="float32", keep_checkpoint=True)
