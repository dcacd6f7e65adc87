"""The weight files a checkpoint is read from, and reading them ahead into the page cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from radixserve.catalog import checkpoint_files
from radixserve.catalog.checkpoint_files import local_weight_files, prefetch


def write(path: Path, size: int) -> Path:
    path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    return path


def hf_directory(tmp_path: Path, shards: dict[str, int], index: bool) -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text("{}")
    for name, size in shards.items():
        write(tmp_path / name, size)
    if index:
        weight_map = {f"w{i}": name for i, name in enumerate(shards)}
        (tmp_path / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": weight_map})
        )
    return tmp_path


def test_the_files_are_those_the_loader_reads(tmp_path):
    indexed = hf_directory(tmp_path / "a", {"b.safetensors": 10, "a.safetensors": 10}, True)
    write(indexed / "stray.safetensors", 10)  # not in the index: the loader skips it too
    assert local_weight_files(str(indexed)) == [
        indexed / "a.safetensors",
        indexed / "b.safetensors",
    ]
    plain = hf_directory(tmp_path / "b", {"model.safetensors": 10}, False)
    assert local_weight_files(f"file://{plain}") == [plain / "model.safetensors"]
    gguf = write(tmp_path / "m.gguf", 10)
    assert local_weight_files(str(gguf)) == [gguf]
    assert local_weight_files(str(tmp_path)) == [gguf]  # a directory holding one GGUF file


@pytest.mark.parametrize(
    "model", ["random:tiny-llama", "builtin:smollm2-135m", "no/such-repo", "/no/such/path"]
)
def test_nothing_is_read_where_nothing_is_local(model, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty Hub cache
    assert local_weight_files(model) == []
    assert prefetch(model) == 0


def test_a_directory_without_weights_is_left_to_the_loader(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert local_weight_files(str(tmp_path)) == []


def test_every_byte_is_read_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint_files, "CHUNK_BYTES", 1000)  # many chunks, several readers
    sizes = {"a.safetensors": 12345, "b.safetensors": 1000, "c.safetensors": 1}
    directory = hf_directory(tmp_path, sizes, True)
    assert prefetch(str(directory)) == sum(sizes.values())


def test_only_what_fits_in_memory_is_read_in_order(tmp_path, monkeypatch):
    sizes = {"a.safetensors": 4000, "b.safetensors": 4000, "c.safetensors": 10}
    directory = hf_directory(tmp_path, sizes, True)
    # 60% of 10,000 bytes: the first file fits, the second would not (and then nothing after)
    monkeypatch.setattr(checkpoint_files, "available_memory_bytes", lambda: 10_000)
    assert prefetch(str(directory)) == 4000
    monkeypatch.setattr(checkpoint_files, "available_memory_bytes", lambda: 0)
    assert prefetch(str(directory)) == 0


class RecordedGate:
    """Stands in for the front end's `imports_off_disk` event: records when the read waited on
    it."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def wait(self) -> bool:
        self.events.append("waited for the imports")
        return True


def test_the_read_starts_only_once_the_imports_are_done(tmp_path, monkeypatch):
    directory = hf_directory(tmp_path, {"a.safetensors": 3000}, False)
    events: list[str] = []
    real_open = os.open

    def opened(path, flags):
        events.append(f"opened {Path(path).name}")
        return real_open(path, flags)

    monkeypatch.setattr(os, "open", opened)
    assert prefetch(str(directory), after=RecordedGate(events)) == 3000
    assert events == ["waited for the imports", "opened a.safetensors"]


def test_the_engine_opens_the_gate_when_the_scheduler_says_it_has_imported():
    import multiprocessing
    import threading

    from radixserve.boundary import SCHEDULER_IMPORTED
    from radixserve.frontend.engine import wait_until_loaded

    front, scheduler = multiprocessing.Pipe()
    imported = threading.Event()
    scheduler.send(SCHEDULER_IMPORTED)
    ready = {
        "status": "ready",
        "max_total_tokens": 64,
        "max_running_requests": 2,
        "context_len": 32,
        "vocab_size": 10,
        "model_description": "m",
        "device": "cpu",
        "attention_backend": "torch_native",
    }
    scheduler.send(ready)
    info = wait_until_loaded(None, front, imported)
    assert imported.is_set()
    assert (info.max_total_tokens, info.attention_backend) == (64, "torch_native")


def test_the_weight_read_holds_one_shard_and_the_largest_tensor_it_converts(tmp_path):
    """What the read holds on the device beside the parameters, from the shards' headers
    (safetensors' own writer made them): tensors already in the model dtype, FP8 weights and
    scales are not converted."""
    import torch
    from safetensors.torch import save_file

    from radixserve.model_loader.hf_dir import load_device_bytes

    save_file(
        {
            "a.weight": torch.zeros(3, 5, dtype=torch.bfloat16),
            "big.weight": torch.zeros(40, 40, dtype=torch.bfloat16),
            "fp8.weight": torch.zeros(50, 50).to(torch.float8_e4m3fn),
            "fp8.weight_scale": torch.zeros(50),
        },
        tmp_path / "one.safetensors",
    )
    save_file(
        {"b.weight": torch.zeros(30, 2), "norm.weight": torch.zeros(7)},
        tmp_path / "two.safetensors",
        metadata={"format": "pt"},
    )
    files = [tmp_path / "one.safetensors", tmp_path / "two.safetensors"]
    entries = {name: rest for name, *rest in checkpoint_files.tensor_entries(files)}
    assert entries["big.weight"] == ["BF16", 1600, 3200]
    assert entries["b.weight"] == ["F32", 60, 240]
    assert entries["fp8.weight"] == ["F8_E4M3", 2500, 2500]
    largest_shard = (tmp_path / "one.safetensors").stat().st_size
    # served in bf16: only the float32 tensors convert, the largest has 60 elements
    assert load_device_bytes(files, torch.bfloat16) == largest_shard + 60 * 2
    # served in float32: the bf16 ones convert (the FP8 weight and its scale never do)
    assert load_device_bytes(files, torch.float32) == largest_shard + 1600 * 4
