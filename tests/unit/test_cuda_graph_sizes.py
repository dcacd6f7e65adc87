"""The decode batch sizes CUDA graphs are captured for (pure arithmetic: runs on the CPU)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radixserve.model_executor.cuda_graph_runner import capture_batch_sizes


def test_default_list() -> None:
    assert capture_batch_sizes(256) == [
        1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64,
        80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
    ]  # fmt: skip


@given(st.integers(min_value=1, max_value=1024))
def test_every_batch_pads_to_a_close_captured_size(max_bs: int) -> None:
    sizes = capture_batch_sizes(max_bs)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == max_bs
    for smaller, larger in zip(sizes, sizes[1:], strict=False):
        # padding: powers of two up to 8, then at most 8 rows up to 64 and 16 above
        if larger <= 8:
            assert larger <= 2 * smaller
        else:
            assert larger - smaller <= (8 if larger <= 64 else 16)
