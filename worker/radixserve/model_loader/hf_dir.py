"""Read a Hugging Face checkpoint directory: config.json plus safetensors shards.

For a GPU, shards are read by fastsafetensors: many threads pread each file into pinned bounce
buffers and copy it straight into the GPU's memory, one file at a time, so a cold read is bound
by the disk, not by the page faults of one thread (a memory-mapped `safe_open` read 16 GB in
about 35 s on the H200 machine; docs/benchmarks.md has both). For the CPU, `safe_open`'s
memory map is the fastest there is: its tensors are views of the page cache, copied once, into
the parameters (fastsafetensors reads the bundled model's 538 MB in 1.3 s, the map in 0.02 s).
Neither ever holds a second full copy of the checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, GenerationConfig

from radixserve.model_loader.config import as_id_set

SAFETENSORS_INDEX = "model.safetensors.index.json"
# parallel preads per shard: enough to keep an NVMe queue full
READ_THREADS = 16
# Buffers some old checkpoints saved alongside the parameters; the model recomputes them.
_NON_PARAMETER_SUFFIXES = ("rotary_emb.inv_freq",)


def is_hf_directory(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def safetensors_files(directory: Path) -> list[Path]:
    """The shards named by the index file, or every `*.safetensors` file when there is none."""
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [directory / name for name in sorted(set(weight_map.values()))]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"{directory} has config.json but no *.safetensors weights "
            "(convert .bin checkpoints with save_pretrained(safe_serialization=True))"
        )
    return files


def load_hf_config(directory: Path) -> transformers.PretrainedConfig:
    return AutoConfig.from_pretrained(str(directory))


def generation_eos_token_ids(directory: Path) -> set[int]:
    """`generation_config.json` often lists more stop ids than config.json (e.g. Llama 3's
    end-of-turn token)."""
    if not (directory / "generation_config.json").is_file():
        return set()
    return as_id_set(GenerationConfig.from_pretrained(str(directory)).eos_token_id)


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
                        yield name, shard.get_tensor(name).to(dtype)
        return
    from fastsafetensors import ParallelLoader

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
                yield name, tensor.to(dtype)
    finally:
        loader.close()
