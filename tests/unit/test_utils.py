"""utils.device_tensor: the same tensor torch.tensor would build, from lists or tensors."""

from __future__ import annotations

import torch

from radixserve.utils import device_tensor


def test_device_tensor_matches_torch_tensor_on_cpu():
    t = device_tensor([[1, 2], [3, 4]], torch.int32, "cpu")
    assert t.dtype == torch.int32 and t.tolist() == [[1, 2], [3, 4]]
    src = torch.tensor([1.5, 2.5])
    converted = device_tensor(src, torch.float64, torch.device("cpu"))
    assert converted.dtype == torch.float64 and converted.tolist() == [1.5, 2.5]
    assert device_tensor([], torch.int64, "cpu").shape == (0,)
