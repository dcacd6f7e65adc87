"""Run the LoRA shrink/expand kernels in Triton's CPU interpreter against a float64 reference
of each token's own adapter, and against the torch path; print one JSON result line. Started by
test_lora_interpret.py in a subprocess (TRITON_INTERPRET must be set before the kernel module is
imported)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from unittest import mock

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from lora_reference import reference, rel, segments  # noqa: E402
from triton_interpret_check import _allow_one_element_index  # noqa: E402

from radixserve.kernels import lora as lora_kernels  # noqa: E402
from radixserve.kernels import triton_support  # noqa: E402
from radixserve.layers.layernorm import GemmaRMSNorm, RMSNorm  # noqa: E402
from radixserve.layers.linear import Linear  # noqa: E402
from radixserve.layers.lora_linear import LoRABatch, LoRALinear  # noqa: E402
from radixserve.models.llama import LlamaDecoderLayer  # noqa: E402

_allow_one_element_index()
gen = torch.Generator().manual_seed(0)


# (segment lengths, their slots, K, sub-projection widths, rank, slots in the pool): a prefill
# mix with the base in the middle and a segment longer than a block, decode rows (one token
# each, grouped by slot) with padding rows, a rank below 16, decode rows over several blocks, a
# decode pass whose K splits over programs (2100: three splits, the last one short) with three
# fused sub-projections whose boundaries fall inside column blocks, a base-only decode pass;
# then grouped decode patterns: random slots with base rows, every row one adapter (three
# blocks, the last partial), every row a different adapter (a pool of 6 slots); one row
# (`_shrink_row_kernel`): fused sub-projections with K not a power of two, a K past 8192, the
# base row
CASES = [
    ([20, 3, 17], [1, -1, 0], 96, [80], 16, 3),
    ([1, 1, 1, 1, 1, 1], [2, 0, -1, 2, 1, -1], 64, [48], 8, 3),
    ([5], [-1], 32, [40], 16, 3),
    ([1] * 70, [(i * 7) % 4 - 1 for i in range(70)], 32, [40], 8, 3),
    ([1] * 5, [0, 2, -1, 0, 1], 2100, [80, 40, 40], 8, 3),
    ([17, 4], [2, 0], 700, [70, 30], 16, 3),
    ([1] * 3, [-1, -1, -1], 700, [40], 16, 3),
    ([1] * 45, torch.randint(-1, 5, (45,), generator=gen).tolist(), 96, [48, 16], 16, 5),
    ([1] * 37, [1] * 37, 64, [40], 8, 3),
    ([1] * 6, [5, 0, 3, 1, 4, 2], 64, [24, 8, 8], 16, 6),
    ([1], [1], 4100, [40, 20, 20], 16, 3),
    ([1], [0], 9000, [48], 8, 2),
    ([1], [-1], 300, [40], 16, 3),
]
results = []
with torch.no_grad(), mock.patch.object(triton_support, "enabled_for", lambda x: True):
    for lens, slots, k, sizes, rank, n_slots in CASES:
        n = sum(sizes)
        for dtype in (torch.float32, torch.float16):
            layout = segments(lens, slots, n_slots)
            token_slots = layout.token_slots
            tokens = sum(lens)
            x = torch.randn(tokens, k, generator=gen).to(dtype)
            a = (torch.randn(n_slots, len(sizes) * rank, k, generator=gen) * 0.1).to(dtype)
            b = (torch.randn(n_slots, n, rank, generator=gen) * 0.1).to(dtype)
            base = torch.randn(tokens, n, generator=gen).to(dtype)
            s = lora_kernels.shrink(x, a, layout)
            y = base.clone()
            lora_kernels.expand(y, s, b, layout, sub_sizes=sizes)
            y_torch = base.clone()
            with mock.patch.object(triton_support, "enabled_for", lambda x: False):
                s_torch = lora_kernels.shrink(x, a, layout)
                lora_kernels.expand(y_torch, s_torch, b, layout, sizes)
            want = base.double() + reference(x, a, b, token_slots, sizes, rank)
            base_rows = token_slots < 0
            results.append(
                {
                    "case": f"{lens}-{slots}-{dtype}",
                    "dtype": str(dtype),
                    "rel_err": rel(y, want),
                    "torch_rel_err": rel(y_torch, want),
                    "base_rows_untouched": bool(torch.equal(y[base_rows], base[base_rows])),
                    "splits": s.shape[0],
                }
            )
    # the wrapper over a fused q/k/v-like projection: column slices of y, B and the shrink
    # output go to the kernels as strided views; the same wrapper through the torch path
    batch = LoRABatch(torch.device("cpu"), 8, 3)
    base = torch.nn.Linear(48, 24 + 8 + 8, bias=False)
    layer = LoRALinear(base, 48, [24, 8, 8], 3, 16, batch, torch.float32)
    layer.lora_a.copy_(torch.randn(layer.lora_a.shape, generator=gen) * 0.1)
    layer.lora_b.copy_(torch.randn(layer.lora_b.shape, generator=gen) * 0.1)
    batch.prepare([0, -1, 2, 1], [7, 2, 1, 18])
    x = torch.randn(28, 48, generator=gen)
    fused = layer(x)
    with mock.patch.object(triton_support, "enabled_for", lambda x: False):
        unfused = layer(x)
    # a decode pass through the batch's own block table (rows grouped by slot)
    batch.prepare([1, -1, 0, 1, 2, 1], [1] * 6)
    x_decode = torch.randn(6, 48, generator=gen)
    fused_decode = layer(x_decode)
    with mock.patch.object(triton_support, "enabled_for", lambda x: False):
        unfused_decode = layer(x_decode)
wrapper_rel_err = max(rel(fused, unfused.double()), rel(fused_decode, unfused_decode.double()))

# batch 1 (one half-precision row): the adapter's expand in the base GEMV's epilogue for fused
# q/k/v-like sub-projections, one projection, and gated (the MLP's activation after both halves'
# adapter terms), for each slot and the base (-1), against the torch path of the same wrapper
epilogue = []
batch = LoRABatch(torch.device("cpu"), 1, 3)
for sizes, gated in (([24, 12, 12], False), ([48], False), ([40, 40], True)):
    base = Linear(300, sum(sizes), bias=False).half()
    layer = LoRALinear(base, 300, sizes, 3, 8, batch, torch.float16)
    layer.lora_a.copy_(torch.randn(layer.lora_a.shape, generator=gen) * 0.1)
    layer.lora_b.copy_(torch.randn(layer.lora_b.shape, generator=gen) * 0.1)
    x = torch.randn(1, 300, generator=gen).half()
    for slot in (0, 2, -1):
        batch.prepare([slot], [1])
        run = layer.silu_and_mul if gated else layer
        with torch.no_grad():
            with mock.patch.object(triton_support, "enabled_for", lambda x: True):
                fused = run(x)
            reference_out = run(x)
        epilogue.append(
            {"gated": gated, "slot": slot, "rel_err": rel(fused, reference_out.double())}
        )

# batch 1: the norm before q/k/v or gate/up and the projection's shrink in one launch
# (`norm_and_shrink`, through the decoder layer's `norm_before`), with and without the residual
# add, Llama's and Gemma's norm, an adapter row and a base row in an active batch (a captured
# graph's), plain and gated; then the projection called on another row than the norm's output
# must shrink that row itself. Each against the torch path of the same layer and norm.
norm_shrink = []
batch = LoRABatch(torch.device("cpu"), 1, 3)
for sizes, gated in (([24, 12, 12], False), ([40, 40], True)):
    base = Linear(300, sum(sizes), bias=False).half()
    layer = LoRALinear(base, 300, sizes, 3, 8, batch, torch.float16)
    layer.lora_a.copy_(torch.randn(layer.lora_a.shape, generator=gen) * 0.1)
    layer.lora_b.copy_(torch.randn(layer.lora_b.shape, generator=gen) * 0.1)
    run = layer.silu_and_mul if gated else layer
    for norm_cls, with_residual, slot in (
        (RMSNorm, True, 2),
        (RMSNorm, False, 0),
        (GemmaRMSNorm, True, 1),
        (RMSNorm, True, -1),
    ):
        norm = norm_cls(300, eps=1e-5).half()
        norm.weight.data.copy_(
            torch.randn(300, generator=gen) * 0.2 + (0 if norm_cls is GemmaRMSNorm else 1)
        )
        x = torch.randn(1, 300, generator=gen).half()
        residual = torch.randn(1, 300, generator=gen).half() if with_residual else None
        batch.prepare([slot], [1], always=True)
        outs = {}
        for path, on in (("fused", True), ("torch", False)):
            with (
                torch.no_grad(),
                mock.patch.object(triton_support, "enabled_for", lambda t, on=on: on),
            ):
                r_in = residual.clone() if residual is not None else None
                normed, summed = LlamaDecoderLayer.norm_before(norm, layer, x.clone(), r_in)
                taken = layer._shrunk_by_norm is not None
                outs[path] = (run(normed), normed, summed, taken)
        other = torch.randn(1, 300, generator=gen).half()
        with torch.no_grad(), mock.patch.object(triton_support, "enabled_for", lambda t: True):
            fresh = run(other)
            LlamaDecoderLayer.norm_before(norm, layer, x.clone(), residual)
            stale = run(other)  # another row: the norm's shrink is not this row's
        fused, torch_path = outs["fused"], outs["torch"]
        norm_shrink.append(
            {
                "case": f"{norm_cls.__name__} residual={with_residual} slot={slot} gated={gated}",
                "took_the_fused_norm": fused[3],
                "torch_path_did_not": not torch_path[3],
                "rel_err": rel(fused[0], torch_path[0].double()),
                "normed_rel_err": rel(fused[1], torch_path[1].double()),
                "residual_same": bool(torch.equal(fused[2], torch_path[2])),
                "other_row_rel_err": rel(stale, fresh.double()),
            }
        )
print(
    json.dumps(
        {
            "cases": results,
            "wrapper_rel_err": wrapper_rel_err,
            "epilogue": epilogue,
            "norm_shrink": norm_shrink,
        }
    )
)
