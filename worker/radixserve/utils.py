"""Small helpers shared across packages: host-to-device copies that never stall the host."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def device_tensor(
    data: torch.Tensor | Sequence, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """`torch.tensor(data, dtype=dtype, device=device)` without a host sync.

    A blocking copy from pageable host memory to a CUDA device waits until the device has
    finished everything queued before it: under overlap scheduling, the whole batch in flight,
    so the host stops preparing the next one. Staged through pinned memory the copy is queued
    like a kernel instead; PyTorch's pinned-memory cache keeps the staging block alive until
    the copy has run.
    """
    host = data.to(dtype) if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype)
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def resolve_device(device: str) -> str:
    """`--device auto` is cuda where torch sees a GPU, else cpu; anything else as given."""
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"
