"""Read a Hugging Face checkpoint directory: config.json plus safetensors shards.

For a GPU, shards are read by fastsafetensors: many threads pread each file into pinned bounce
buffers and copy it straight into the GPU's memory, one file at a time, so a cold read is bound
by the disk, not by the page faults of one thread (a memory-mapped `safe_open` read 16 GB in
about 35 s on the H200 machine; docs/benchmark-log.md has both). Its reads are buffered, not
O_DIRECT (its default on local disks): the front end has been reading the same files ahead
into the page cache since the process started (checkpoint_files.py), and a second pod on the
node finds them there too. For the CPU, `safe_open`'s
memory map is the fastest there is: its tensors are views of the page cache, copied once, into
the parameters (fastsafetensors reads the bundled model's 538 MB in 1.3 s, the map in 0.02 s).
Neither ever holds a second full copy of the checkpoint. Quantized checkpoints keep what
quantization owns as stored: FP8 weights stay FP8 and scales stay float32; the model's
quantization method (layers/quantization) takes them from there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, GenerationConfig

from radixserve.catalog import checkpoint_files
from radixserve.catalog.architectures import check_architecture
from radixserve.model_loader.config import as_id_set

# parallel preads per shard: enough to keep an NVMe queue full
READ_THREADS = 16
# Buffers some old checkpoints saved alongside the parameters; the model recomputes them.
_NON_PARAMETER_SUFFIXES = ("rotary_emb.inv_freq",)
# Quantization scales: kept in float32 whatever the model dtype.
SCALE_SUFFIXES = ("_scale", "_scale_inv")
# the names safetensors headers give the model dtypes
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def load_hf_config(directory: Path) -> transformers.PretrainedConfig:
    """The directory's config, its architecture checked on the raw JSON first (so a model we
    do not serve fails with one clear line, also where transformers does not know it)."""
    raw = json.loads((directory / "config.json").read_text())
    check_architecture(raw.get("model_type"), raw.get("architectures"))
    return AutoConfig.from_pretrained(str(directory))


def kept_as_stored(name: str, element_size: int) -> bool:
    """One-byte (FP8) weights and quantization scales: what the model's quantization method
    takes as stored, whatever the model dtype."""
    return element_size == 1 or name.endswith(SCALE_SUFFIXES)


def as_loaded(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A checkpoint tensor in the form the model loads: floating weights in the model dtype,
    the rest as stored (`kept_as_stored`)."""
    if kept_as_stored(name, tensor.element_size()):
        return tensor
    return tensor.to(dtype)


def generation_eos_token_ids(directory: Path) -> set[int]:
    """`generation_config.json` often lists more stop ids than config.json (e.g. Llama 3's
    end-of-turn token)."""
    if not (directory / "generation_config.json").is_file():
        return set()
    return as_id_set(GenerationConfig.from_pretrained(str(directory)).eos_token_id)


def load_device_bytes(files: list[Path], dtype: torch.dtype) -> int:
    """What reading `files` onto a GPU holds there beside the parameters at its peak: one shard
    (fastsafetensors' buffer, `queue_size=-1` below) and the largest tensor `as_loaded`
    converts to `dtype`, from the shards' headers."""
    target = SAFETENSORS_DTYPES.get(dtype)
    converted = max(
        (
            elements * dtype.itemsize
            for name, stored, elements, size in checkpoint_files.tensor_entries(files)
            if stored != target and not kept_as_stored(name, size // max(elements, 1))
        ),
        default=0,
    )
    return max(file.stat().st_size for file in files) + converted


def iter_safetensors(
    files: list[Path], dtype: torch.dtype, device: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor in `dtype`) for every tensor of the shards: on `device` when it is a GPU,
    else views of the memory-mapped files."""
    if device == "cpu":
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as shard:
                for name in shard.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if not name.endswith(_NON_PARAMETER_SUFFIXES):
                        yield name, as_loaded(name, shard.get_tensor(name), dtype)
        return
    from fastsafetensors import ParallelLoader

    os.environ.setdefault("FASTSAFETENSORS_ODIRECT", "0")  # read what the read-ahead cached

    if device == "cuda":  # this process's GPU (its tensor-parallel rank's)
        device = f"cuda:{torch.cuda.current_device()}"
    loader = ParallelLoader(
        None,
        [str(file) for file in files],
        device=device,
        nogds=True,  # GPUDirect Storage is rarely there in a pod; pread + DMA always is
        queue_size=-1,  # one file in flight: the transient buffer is one shard, not two
        use_tqdm_on_load=False,
        accumulate_resident=False,  # each tensor is copied into its parameter and dropped
        max_threads=READ_THREADS,
    )
    try:
        for name, tensor in loader.iterate_weights():
            if not name.endswith(_NON_PARAMETER_SUFFIXES):
                yield name, as_loaded(name, tensor, dtype)
    finally:
        loader.close()
