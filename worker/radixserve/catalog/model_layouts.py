"""Layouts of a served architecture that are not served, refused from the config alone
(torch-free, with `check_servable`, before anything loads), each in one line.

DeepSeek V2/V3 (`models/deepseek_v2.py`) route tokens three ways, each with its own scoring:
V3's `noaux_tc` (sigmoid scores, the correction bias), V2's `group_limited_greedy` and
V2-Lite's `greedy` (softmax scores). A config naming another method, or another scoring for
one of these, is refused rather than served with the wrong routing.
"""

from __future__ import annotations

from typing import Any

from radixserve.catalog.architectures import UnsupportedModelError

# topk_method -> the scoring_func it is served with
DEEPSEEK_ROUTING = {"noaux_tc": "sigmoid", "greedy": "softmax", "group_limited_greedy": "softmax"}
_DEEPSEEK_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")


def check_layout(config: dict[str, Any]) -> None:
    """Raise UnsupportedModelError for a layout of a served architecture that is not served.
    `config`: the raw config.json (or a transformers config's `to_dict()`)."""
    if config.get("model_type") not in _DEEPSEEK_MODEL_TYPES:
        return
    method = config.get("topk_method") or "noaux_tc"
    if method not in DEEPSEEK_ROUTING:
        raise UnsupportedModelError(
            f"DeepSeek routing topk_method {method!r} is not supported; supported: "
            f"{', '.join(DEEPSEEK_ROUTING)}"
        )
    scoring = config.get("scoring_func") or DEEPSEEK_ROUTING[method]
    if scoring != DEEPSEEK_ROUTING[method]:
        raise UnsupportedModelError(
            f"DeepSeek routing {method!r} with scoring_func {scoring!r} is not supported "
            f"(served: {DEEPSEEK_ROUTING[method]!r})"
        )
