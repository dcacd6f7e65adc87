"""A model too large for the device fails before loading, with a message that says what to do."""

from __future__ import annotations

import pytest
import torch

from radixserve.model_executor.model_runner import GiB, weight_bytes, weights_fit_problem
from radixserve.model_loader.loader import load_model_source
from radixserve.models.registry import get_model_class


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_meta_sizing_equals_the_loaded_model(preset):
    config = load_model_source(f"random:{preset}", dtype="bfloat16", device="cpu").config
    model_cls = get_model_class(config.architecture)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            sized = weight_bytes(model_cls(config.hf_config))
        real = model_cls(config.hf_config)
    finally:
        torch.set_default_dtype(default)
    params = sum(p.numel() * 2 for p in real.parameters())
    assert sized == weight_bytes(real) and sized >= params > 0


def test_weights_that_fit_pass():
    assert weights_fit_problem(10 * GiB, 11 * GiB, 80 * GiB, "cuda:0") is None


def test_weights_that_do_not_fit_say_what_to_do():
    problem = weights_fit_problem(140 * GiB, 70 * GiB, 80 * GiB, "cuda:0")
    assert problem is not None
    assert "cuda:0" in problem and "140.00 GiB" in problem and "70.00 GiB" in problem
    assert "--tp-size" in problem
