"""Run the Triton MLA decode kernel in Triton's CPU interpreter against the torch reference
(layers/mla.py's `mla_decode_native`) and a float64 dense computation; print one JSON line.

Started by test_mla_interpret.py in a subprocess (TRITON_INTERPRET must be set before the
kernel module is imported). Small latent sizes keep the interpreter quick; tests/gpu repeats
the check at DeepSeek's 512 + 64 in bf16.
"""

from __future__ import annotations

import json
import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from radixserve.kernels.mla_decode import mla_decode_fwd, num_splits  # noqa: E402
from radixserve.layers.mla import mla_decode_native  # noqa: E402


def _allow_one_element_index() -> None:
    """Triton 3.6's interpreter does int(array of shape (1,)) for loop bounds, which numpy
    2.x refuses; take the single element instead."""
    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def dense(q: torch.Tensor, rows: list[torch.Tensor], latent: int, scale: float) -> torch.Tensor:
    """float64, request by request: softmax(q . K^T * scale) K[:, :latent]."""
    out = []
    for b, kv in enumerate(rows):
        kv = kv.double()
        weights = torch.softmax(q[b].double() @ kv.T * scale, dim=-1)
        out.append(weights @ kv[:, :latent])
    return torch.stack(out)


def case(seq_lens: list[int], heads: int, latent: int, rope: int, sms: int) -> dict:
    generator = torch.Generator().manual_seed(sum(seq_lens) + heads)
    width = latent + rope
    slots = sum(seq_lens) + 1
    pool = torch.randn(slots + 1, 1, width, generator=generator)
    bs = len(seq_lens)
    req_to_token = torch.zeros(bs + 2, max(seq_lens) + 8, dtype=torch.int32)
    # each request's slots scattered over the pool (a permutation), rows out of order
    order = torch.randperm(slots, generator=generator)[: sum(seq_lens)] + 1
    rows, start = [], 0
    req_pool_indices = torch.arange(bs, dtype=torch.int64).flip(0) + 1
    for b, n in enumerate(seq_lens):
        req_to_token[req_pool_indices[b], :n] = order[start : start + n].to(torch.int32)
        rows.append(pool[order[start : start + n].long(), 0])
        start += n
    q = torch.randn(bs, heads, width, generator=generator)
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    scale = width**-0.5
    out = mla_decode_fwd(q, pool, req_to_token, req_pool_indices, lens, latent, scale, sms)
    native = mla_decode_native(
        q, pool, req_to_token, req_pool_indices, lens, max(seq_lens), latent, scale
    )
    ref = dense(q, rows, latent, scale)
    return {
        "seq_lens": seq_lens,
        "heads": heads,
        "splits": num_splits(bs, heads, sms),
        "rel_err": float((out.double() - ref).norm() / ref.norm()),
        "native_rel_err": float((native.double() - ref).norm() / ref.norm()),
    }


def main() -> None:
    _allow_one_element_index()
    results = [
        # several requests, heads that are not a multiple of the 16-row head block
        case([1, 70, 200], heads=20, latent=64, rope=16, sms=8),
        # one long request over many splits (the GPU's split count at batch 1)
        case([1500], heads=16, latent=32, rope=8, sms=132),
    ]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
