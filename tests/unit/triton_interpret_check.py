"""Run the Triton attention kernels in Triton's CPU interpreter; print one JSON result line.

Started by test_triton_interpret.py in a subprocess, because TRITON_INTERPRET must be set
before any kernel module is imported and must not leak into the rest of the test session.
The interpreter's bf16 dot is broken upstream, so bf16 is left to tests/gpu.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

import torch  # noqa: E402
from attention_cases import (  # noqa: E402
    dense_reference,
    make_case,
    relative_error,
    run_backend,
    stored_kv_matches,
)
from triton.runtime import interpreter  # noqa: E402

from radixserve.forward.mode import ForwardMode  # noqa: E402
from radixserve.kernels.kv_indices import gather_kv_indices  # noqa: E402
from radixserve.layers.attention.torch_native_backend import TorchNativeAttnBackend  # noqa: E402
from radixserve.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402


def _allow_one_element_index() -> None:
    """Triton 3.6's interpreter does int(array of shape (1,)) for loop bounds, which numpy
    2.x refuses; take the single element instead."""
    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


# (mode, prefix_lens, extend_lens, q heads, kv heads, head_dim): GQA 4 and 1, a head_dim
# that is not a power of two, a prefix that spans several tiles, decode long enough to split.
CASES = [
    (ForwardMode.DECODE, [5, 130, 0, 300], [1, 1, 1, 1], 8, 2, 64),
    (ForwardMode.DECODE, [200], [1], 4, 4, 48),
    (ForwardMode.EXTEND, [0, 40, 7], [33, 5, 70], 4, 1, 32),
    (ForwardMode.MIXED, [70, 9, 3], [40, 1, 1], 2, 2, 48),
]
# sliding windows shorter and longer than the sequences (decode splits over the window only;
# extend tiles whose first query's window starts inside the prefix or the new tokens), a
# logit soft-cap, and an FP8 pool: (mode, prefix, extend, heads, kv heads, head_dim, options)
VARIANT_CASES = [
    (ForwardMode.DECODE, [5, 130, 0, 300], [1, 1, 1, 1], 8, 2, 64, {"sliding_window": 50}),
    (ForwardMode.EXTEND, [0, 40, 7], [33, 5, 70], 4, 1, 32, {"sliding_window": 20}),
    (ForwardMode.MIXED, [70, 9, 3], [40, 1, 1], 2, 2, 48, {"sliding_window": 64, "logit_cap": 0.3}),
    (ForwardMode.DECODE, [200, 17], [1, 1], 4, 2, 32, {"logit_cap": 0.5}),
    (
        ForwardMode.DECODE,
        [5, 130, 0, 300],
        [1, 1, 1, 1],
        8,
        2,
        64,
        {"kv_dtype": torch.float8_e4m3fn},
    ),
    (ForwardMode.EXTEND, [0, 40, 7], [33, 5, 70], 4, 1, 32, {"kv_dtype": torch.float8_e4m3fn}),
    # attention sinks (gpt-oss): decode over several splits, extend and mixed with a window
    (ForwardMode.DECODE, [5, 130, 0, 300], [1, 1, 1, 1], 8, 2, 64, {"sinks": True}),
    (ForwardMode.EXTEND, [0, 40, 7], [33, 5, 70], 4, 1, 32, {"sinks": True, "sliding_window": 20}),
    (ForwardMode.MIXED, [70, 9, 3], [40, 1, 1], 2, 2, 48, {"sinks": True}),
]


def main() -> None:
    _allow_one_element_index()
    gen = torch.Generator().manual_seed(0)
    results = []
    for mode, prefix, extend, heads, kv_heads, head_dim in CASES:
        for dtype in (torch.float32, torch.float16):
            case = make_case(mode, prefix, extend, heads, kv_heads, head_dim, dtype, "cpu", gen)
            out = run_backend(TritonAttnBackend(case.context), case)
            results.append(
                {
                    "case": f"{mode.name}-{heads}/{kv_heads}-d{head_dim}-{dtype}",
                    "dtype": str(dtype),
                    "rel_err": relative_error(out, dense_reference(case)),
                    "stored_kv": stored_kv_matches(case),
                }
            )
    variants = []
    for mode, prefix, extend, heads, kv_heads, head_dim, options in VARIANT_CASES:
        case = make_case(
            mode, prefix, extend, heads, kv_heads, head_dim, torch.float32, "cpu", gen, **options
        )
        out = run_backend(TritonAttnBackend(case.context), case)
        native_gen = torch.Generator().manual_seed(len(variants))
        shape = (mode, prefix, extend, heads, kv_heads, head_dim, torch.float32, "cpu")
        native_case = make_case(*shape, native_gen, **options)
        native = run_backend(TorchNativeAttnBackend(native_case.context), native_case)
        variants.append(
            {
                "case": f"{mode.name}-{options}",
                "rel_err": relative_error(out, dense_reference(case)),
                "native_rel_err": relative_error(native, dense_reference(native_case)),
                "stored_kv": stored_kv_matches(case) and stored_kv_matches(native_case),
            }
        )
    # an H200's split count (64 at one request, one kv head) over 1,501 tokens: 24 splits hold
    # keys, more than the merge's short tile of 16
    case = make_case(ForwardMode.DECODE, [1500], [1], 4, 1, 32, torch.float32, "cpu", gen)
    backend = TritonAttnBackend(case.context)
    backend.num_sms = 132
    out = run_backend(backend, case)
    long_decode = {
        "splits": backend.forward_metadata.num_kv_splits,
        "rel_err": relative_error(out, dense_reference(case)),
    }
    fb = case.forward_batch
    indptr = torch.zeros(fb.batch_size + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(fb.seq_lens, 0)
    indices = torch.full((int(indptr[-1]),), -1, dtype=torch.int32)
    gather_kv_indices(
        fb.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens, indptr, indices
    )
    expected = torch.cat(
        [
            fb.req_to_token_pool.req_to_token[row, :n]
            for row, n in zip(fb.req_pool_indices.tolist(), fb.seq_lens.tolist(), strict=True)
        ]
    )
    print(
        json.dumps(
            {
                "attention": results,
                "variants": variants,
                "long_decode": long_decode,
                "kv_indices_ok": bool(torch.equal(indices, expected)),
            }
        )
    )


if __name__ == "__main__":
    main()
