"""Architecture name (config.architectures[0]) -> model class, from the one list of the
served architectures (catalog/architectures.py, torch-free, which names each class as
"module:Class"): the model's module is imported when its class is asked for. Whether a model
can be served at all is checked torch-free first (catalog/servable.py)."""

from __future__ import annotations

import importlib

from torch import nn

from radixserve.catalog.architectures import CLASS_BY_ARCHITECTURE


def get_model_class(architecture: str) -> type[nn.Module]:
    try:
        module_name, _, class_name = CLASS_BY_ARCHITECTURE[architecture].partition(":")
    except KeyError:
        supported = ", ".join(sorted(CLASS_BY_ARCHITECTURE))
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {supported}"
        ) from None
    return getattr(importlib.import_module(module_name), class_name)
