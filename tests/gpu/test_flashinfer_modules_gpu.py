"""The FlashInfer modules `flashinfer_kernels` names for a model are the ones its plans load:
after the backend's start (which builds the named ones), a decode, a graph decode and a
prefill pass load nothing else, and `auto` counts them as built."""

from __future__ import annotations

import pytest
import torch
from attention_cases import make_case, run_backend

from radixserve.forward.mode import ForwardMode
from radixserve.layers.attention import flashinfer_kernels
from radixserve.layers.attention.registry import missing_flashinfer_modules

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(32, 8), (8, 8)])
def test_named_modules_are_the_ones_the_plans_load(monkeypatch, num_heads, num_kv_heads):
    flashinfer = pytest.importorskip("flashinfer")
    from flashinfer.jit.core import JitSpec

    from radixserve.layers.attention.flashinfer_backend import FlashInferAttnBackend

    loaded: list[str] = []
    real = JitSpec.build_and_load
    monkeypatch.setattr(
        JitSpec, "build_and_load", lambda self: loaded.append(self.name) or real(self)
    )
    flashinfer.prefill.get_batch_prefill_module.cache_clear()
    flashinfer.decode.get_batch_decode_module.cache_clear()
    gen = torch.Generator().manual_seed(0)
    cases = [
        make_case(mode, prefix, extend, num_heads, num_kv_heads, 128, torch.bfloat16, "cuda", gen)
        for mode, prefix, extend in [
            (ForwardMode.DECODE, [300, 40], [1, 1]),
            (ForwardMode.EXTEND, [0, 64], [100, 30]),
        ]
    ]
    context = cases[0].context
    backend = FlashInferAttnBackend(context)
    named = {spec.name for spec in flashinfer_kernels.KernelSignature.of(context).specs()}
    assert missing_flashinfer_modules(context) == []
    for case in cases:
        run_backend(backend, case)
    backend.init_cuda_graph_state(4)
    fb = cases[0].forward_batch
    backend.init_forward_metadata_capture_cuda_graph(
        2, fb.req_pool_indices, fb.seq_lens, ForwardMode.DECODE
    )
    assert loaded and set(loaded) <= named, (loaded, named)
    kinds = {"prefill" if "prefill" in name else "decode" for name in named}
    tensor_cores = flashinfer_kernels.uses_tensor_core_decode(num_heads, num_kv_heads)
    assert kinds == ({"prefill"} if tensor_cores else {"prefill", "decode"})
