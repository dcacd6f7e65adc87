"""Reading a PEFT LoRA adapter (`adapter_config.json` + `adapter_model.safetensors`) from a local
directory or a Hub repository (fetched into the Hub cache), checked against the served model: every
refusal is a `LoRALoadError` whose message the API returns as a 400.

What is read is kept on the host as `LoRAWeights`: per (layer, projection) the A `[r, in]` and
the B `[out, r]` with PEFT's scaling (alpha / r, or alpha / sqrt(r) with rsLoRA) folded in, so
the pool copies tensors and multiplies nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from radixserve.catalog.hub import resolve_hub_model

# the projections an adapter may target (the Llama family's names, PEFT's target_modules)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_TENSOR = re.compile(
    r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[A-Za-z0-9_-]+)?\.weight$"
)


class LoRALoadError(ValueError):
    """An adapter that cannot be served: the message says why (a 400 to the client)."""


@dataclass
class LoRAWeights:
    """An adapter's tensors on the host: (layer, projection) -> (A [r, in], B·scaling [out, r]).
    `digest`: SHA-256 of its config and weights files, what the disk KV tier names its blocks
    by (the same weights under any name or load share them; other weights never do)."""

    path: str
    rank: int
    tensors: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    digest: bytes = b""

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.tensors.values())


def resolve_adapter_dir(path: str) -> Path:
    """A local directory, or a Hub repo id (`org/name`, `hf://org/name[@revision]`) fetched into
    the Hub cache (HF_HOME: the model-cache volume on Kubernetes) as the base model is, once:
    the operator's `source: hf://...` adapters. With HF_HUB_OFFLINE=1 only the cache is read."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    try:
        fetched = resolve_hub_model(path)
    except ValueError as exc:  # not in the cache and not fetchable: the reason, as a 400
        raise LoRALoadError(f"adapter {path!r}: {exc}") from exc
    if fetched is not None:
        return fetched
    raise LoRALoadError(f"adapter path {path!r} is not a directory nor a Hub repository")


def read_adapter(
    path: str,
    max_rank: int,
    num_layers: int,
    shapes: dict[str, tuple[int, int]],
    dtype: torch.dtype,
) -> LoRAWeights:
    """The adapter at `path`, checked against the model: `shapes` maps each projection of
    TARGETS to its full (in, out) features, which every A and B must match."""
    directory = resolve_adapter_dir(path)
    config, config_bytes = _read_config(directory)
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise LoRALoadError(f"adapter_config.json: r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise LoRALoadError(f"adapter rank {rank} exceeds --max-lora-rank {max_rank}")
    for key, allowed in (("use_dora", (False, None)), ("bias", ("none", None))):
        if config.get(key) not in allowed:
            raise LoRALoadError(f"adapter_config.json: {key}={config[key]!r} is not supported")
    for key in ("modules_to_save", "rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise LoRALoadError(f"adapter_config.json: {key} is not supported")
    targets = config.get("target_modules")
    if isinstance(targets, str) or not targets:
        raise LoRALoadError(
            "adapter_config.json: target_modules must be a list of projection names"
        )
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise LoRALoadError(
            f"target modules {unknown} are not in this model (it has {list(TARGETS)})"
        )
    alpha = config.get("lora_alpha", rank)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    digest = hashlib.sha256(config_bytes)
    tensors = _read_tensors(directory, rank, scaling, num_layers, shapes, dtype, digest)
    return LoRAWeights(str(path), rank, tensors, digest.digest())


def _read_config(directory: Path) -> tuple[dict, bytes]:
    """The adapter's config, and the file's bytes (part of its digest)."""
    config_file = directory / "adapter_config.json"
    if not config_file.is_file():
        raise LoRALoadError(f"{config_file} not found")
    try:
        data = config_file.read_bytes()
        config = json.loads(data)
    except (OSError, ValueError) as exc:
        raise LoRALoadError(f"{config_file} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise LoRALoadError(f"{config_file} is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise LoRALoadError(f"peft_type {config['peft_type']!r} is not LoRA")
    return config, data


def _read_tensors(
    directory: Path,
    rank: int,
    scaling: float,
    num_layers: int,
    shapes: dict[str, tuple[int, int]],
    dtype: torch.dtype,
    digest: hashlib._Hash,
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """The A/B pairs, checked against the model's shapes; the file's bytes go into `digest`."""
    weights_file = directory / "adapter_model.safetensors"
    if not weights_file.is_file():
        raise LoRALoadError(f"{weights_file} not found")
    try:
        data = weights_file.read_bytes()
        digest.update(data)
        raw = load_safetensors(data)
    except (SafetensorError, OSError, ValueError) as exc:
        raise LoRALoadError(f"{weights_file} is not a readable safetensors file: {exc}") from None
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in raw.items():
        match = _TENSOR.search(name)
        if match is None:
            raise LoRALoadError(f"adapter tensor {name!r} is not a LoRA A/B of a projection")
        layer, module, half = int(match[1]), match[2], match[3]
        if module not in shapes:
            raise LoRALoadError(f"adapter tensor {name!r}: this model has no {module}")
        if layer >= num_layers:
            raise LoRALoadError(f"adapter tensor {name!r}: the model has {num_layers} layers")
        in_features, out_features = shapes[module]
        expected = (rank, in_features) if half == "A" else (out_features, rank)
        if tuple(tensor.shape) != expected:
            raise LoRALoadError(
                f"adapter tensor {name!r} has shape {tuple(tensor.shape)}, this base model "
                f"needs {expected}: the adapter was trained for another model"
            )
        halves.setdefault((layer, module), {})[half] = tensor
    tensors = {}
    for key, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise LoRALoadError(f"adapter layer {key[0]} {key[1]} lacks its lora_A or lora_B")
        tensors[key] = (pair["A"].to(dtype), (pair["B"].double() * scaling).to(dtype))
    if not tensors:
        raise LoRALoadError(f"{weights_file} holds no LoRA tensors")
    return tensors
