"""Whether a model can be served at all, from its config alone: the check a start runs before
anything else, torch- and transformers-free.

The front end runs it on the raw config.json while the scheduler process imports torch; the
scheduler waits for the verdict before it loads anything, so its wait is this check's time.
Importing the loader for it (torch, transformers) made the front end the slowest part of a warm
start on the H200 (7.7 s of waiting after the scheduler's imports).
"""

from __future__ import annotations

from typing import Any

from radixserve.catalog.architectures import check_architecture
from radixserve.catalog.model_layouts import check_layout
from radixserve.catalog.quantization_methods import check_method_for, check_quantization


def check_servable(config: dict[str, Any], quantization: str | None) -> None:
    """Raise a ValueError naming what cannot be served (architecture, quantization method, a
    layout of the architecture: catalog/model_layouts.py) and what can. `config`: the model's
    config as a plain dict (config.json, or a transformers config's `to_dict()`)."""
    architecture = check_architecture(config.get("model_type"), config.get("architectures"))
    method = check_quantization(config.get("quantization_config"), quantization)
    check_method_for(architecture, method)
    check_layout(config)
