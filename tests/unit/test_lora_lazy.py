"""The LoRA manager's lazy registry (--lora-load lazy): an adapter known by name and path is
served without being read; its first request reads it off the caller's thread, and only then
does it take host memory (bounded by --max-cpu-loras) and a device slot. A source that cannot
be read fails its requests with the reason (not the manager), and is read again after a while.
A stand-in slot pool records the writes: no model is needed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from radixserve.lora import manager as manager_module
from radixserve.lora.adapter import LoRALoadError
from radixserve.lora.manager import LoRAManager

HIDDEN, RANK = 8, 2


class RecordingPool:
    """What the manager needs of `LoRASlotPool`: its sizes, its device and `write`."""

    def __init__(self, slots: int) -> None:
        self.slots, self.max_rank = slots, 16
        self.batch = SimpleNamespace(device=torch.device("cpu"))
        self.writes: list[tuple[int, str]] = []

    def write(self, slot: int, weights) -> None:
        self.writes.append((slot, weights.path))


def write_adapter(directory: Path, seed: int) -> str:
    directory.mkdir()
    gen = torch.Generator().manual_seed(seed)
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {
        f"{prefix}.lora_A.weight": torch.randn(RANK, HIDDEN, generator=gen),
        f"{prefix}.lora_B.weight": torch.randn(HIDDEN, RANK, generator=gen),
    }
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": 4, "target_modules": ["q_proj"]}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return str(directory)


def make_manager(slots: int = 1, max_cpu_loras: int = 1) -> LoRAManager:
    shapes = {"q_proj": (HIDDEN, HIDDEN)}
    pool = RecordingPool(slots)
    return LoRAManager(pool, max_cpu_loras, 1, shapes, torch.float32)  # type: ignore[arg-type]


def acquire_when_read(manager: LoRAManager, name: str) -> int:
    """`acquire` as the scheduler retries it each step: None while the read runs."""
    slot = manager.acquire(name)
    if slot is None:
        manager.reading[name].result(timeout=30)
        slot = manager.acquire(name)
    assert slot is not None
    return slot


def test_a_registered_adapter_is_served_unread_and_read_on_first_use(tmp_path: Path) -> None:
    manager = make_manager()
    path = write_adapter(tmp_path / "sql", 1)
    manager.register("sql", path)
    # known: served by name (/v1/models, the request check), nothing read or resident
    assert manager.served() == {"sql": path} and "unknown" not in manager.served()
    assert manager.counters.loads == 0 and not manager.host and manager.resident() == []
    assert manager.acquire("sql") is None  # the first request waits while it is read
    assert manager.report(["sql"])["running"] == []
    slot = acquire_when_read(manager, "sql")
    assert manager.counters.loads == 1 and manager.resident() == ["sql"]
    assert manager.pool.writes == [(slot, path)]  # type: ignore[attr-defined]
    assert manager.report([])["running"] == ["sql"]
    manager.release(slot)
    assert manager.acquire("sql") == slot and manager.counters.loads == 1  # loaded stays loaded
    manager.shutdown()


def test_host_memory_holds_at_most_max_cpu_loras_of_a_long_list(tmp_path: Path) -> None:
    manager = make_manager(slots=1, max_cpu_loras=2)
    names = [f"a{i}" for i in range(5)]
    for seed, name in enumerate(names):
        manager.register(name, write_adapter(tmp_path / name, seed))
    assert len(manager.served()) == 5 and not manager.host
    for name in names:
        manager.release(acquire_when_read(manager, name))
        assert len(manager.host) <= 2
    assert manager.counters.loads == 5 and manager.counters.evictions == 4
    assert manager.resident() == ["a4"]
    manager.shutdown()


def test_a_bad_source_fails_its_requests_and_is_read_again_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = make_manager()
    missing = str(tmp_path / "missing")
    manager.register("gone", missing)
    assert manager.acquire("gone") is None
    manager.reading["gone"].exception(timeout=30)
    with pytest.raises(LoRALoadError, match="not a directory nor a Hub repository"):
        manager.acquire("gone")
    # the next requests get the same answer at once, without another read
    with pytest.raises(LoRALoadError, match="not a directory"):
        manager.acquire("gone")
    assert "gone" not in manager.reading and manager.served() == {"gone": missing}
    # the source is fixed; after the retry interval the next request reads it again
    write_adapter(tmp_path / "missing", 3)
    monkeypatch.setattr(manager_module, "RETRY_FAILED_READ_SECONDS", 0.0)
    assert acquire_when_read(manager, "gone") == 0 and manager.resident() == ["gone"]
    manager.shutdown()


def test_registering_again_replaces_a_loaded_adapter(tmp_path: Path) -> None:
    manager = make_manager()
    first, second = write_adapter(tmp_path / "v1", 1), write_adapter(tmp_path / "v2", 2)
    manager.register("sql", first)
    slot = acquire_when_read(manager, "sql")
    old_uid = manager.uid("sql")
    manager.register("sql", second)
    # a new prefix-cache namespace, nothing of the old weights kept, the held slot finishes
    assert manager.uid("sql") != old_uid and "sql" not in manager.host
    assert manager.resident() == [] and manager.served() == {"sql": second}
    manager.release(slot)
    assert acquire_when_read(manager, "sql") == 0
    assert manager.pool.writes[-1] == (0, second)  # type: ignore[attr-defined]
    manager.shutdown()
