"""FlashInfer's compiled modules for one model: which ones its plans load, whether they are
built, and building them, in one ninja run here or in a background process.

FlashInfer compiles a module per (kind, dtypes, head dim, window, soft-cap) at the first plan
that needs it, one at a time. On the H200 an 8B model's tensor-core decode module took 27.7 s
inside CUDA graph capture and its FA3 prefill module 57.4 s in warm-up: a first-ever pod was
ready after 111 s. Here those modules are named up front, with the arguments the wrappers'
plans pass (flashinfer 0.5's decode.py and prefill.py), so that
- `--attention-backend flashinfer` builds the missing ones in one ninja run before its first
  plan (`build`; tensor-parallel rank 0 for every rank), and fails at start with one line
  where it cannot;
- `auto` takes FlashInfer only when all are built (the prebuilt package, or the JIT cache on
  the model-cache volume), and otherwise serves this start with triton while a niced background
  process builds them (`build_in_background`), so the next start on that cache is FlashInfer's.

Imported only where flashinfer is installed.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from radixserve.layers.attention.base import AttentionContext

logger = logging.getLogger(__name__)

# From this many query heads per kv head on, FlashInfer's tensor-core (prefill-style) decode
# beats its CUDA-core decode.
TENSOR_CORE_DECODE_MIN_GROUP = 4
# FlashInfer's PosEncodingMode.NONE: rotary is applied before the cache, never in the kernel
_NO_POS_ENCODING = 0
# the background build yields the CPU to the serving process beside it
_BACKGROUND_NICE = 10


def uses_tensor_core_decode(num_heads: int, num_kv_heads: int) -> bool:
    return num_heads // num_kv_heads >= TENSOR_CORE_DECODE_MIN_GROUP


def prefill_backend(context: AttentionContext) -> str:
    """The prefill wrappers' backend: what FlashInfer's `auto` picks on this GPU (FA3 on
    Hopper), except FA2 where the KV dtype is not the query's. FA3 multiplies Q by K on
    Hopper's wgmma, which has no bf16 x e4m3 form (CUTLASS's GMMA selector pairs f16, bf16 or
    FP8 only with their own kind), so an FP8 KV pool under bf16 queries cannot build there;
    `auto` does not see that and picked FA3, and the start failed. FA2 reads FP8 KV as it
    multiplies (its tensor-core decode already runs that way here)."""
    if context.kv_dtype != context.dtype:
        return "fa2"
    from flashinfer.utils import determine_attention_backend

    return determine_attention_backend(
        context.device, _NO_POS_ENCODING, False, False, context.dtype, context.kv_dtype
    )


@dataclass(frozen=True)
class KernelSignature:
    """What decides FlashInfer's modules for a model, in plain values (it travels as JSON to
    the background builder, which must not touch the GPU)."""

    q_dtype: str  # torch dtype names
    kv_dtype: str
    head_dim: int
    tensor_core_decode: bool
    prefill_backend: str  # "fa3" or "fa2": `prefill_backend`
    variants: tuple[tuple[bool, bool], ...]  # (sliding window, soft-cap) of each variant
    cuda_arch: str  # FLASHINFER_CUDA_ARCH_LIST for the builder, e.g. "9.0a"

    @classmethod
    def of(cls, context: AttentionContext) -> KernelSignature:
        major, minor = torch.cuda.get_device_capability(context.device)
        variants = {(v.windowed, v.logit_cap > 0) for v in context.planned_variants()}
        return cls(
            q_dtype=str(context.dtype).removeprefix("torch."),
            kv_dtype=str(context.kv_dtype).removeprefix("torch."),
            head_dim=context.head_dim,
            tensor_core_decode=uses_tensor_core_decode(context.num_heads, context.num_kv_heads),
            prefill_backend=prefill_backend(context),
            variants=tuple(sorted(variants)),
            # FlashInfer builds for the "a" (arch-specific) target from Hopper on
            cuda_arch=f"{major}.{minor}{'a' if major >= 9 else ''}",
        )

    def specs(self) -> list[Any]:
        """FlashInfer's JitSpec of each module the backend's decode and prefill plans load."""
        return _specs(self)


@functools.cache
def _specs(signature: KernelSignature) -> list[Any]:
    """`KernelSignature.specs`, generated once a process: `auto`'s choice and the backend's
    start both ask, and each generation writes FlashInfer's sources."""
    from flashinfer.jit.attention.modules import (
        gen_batch_decode_module,
        gen_batch_prefill_module,
    )

    q, kv = getattr(torch, signature.q_dtype), getattr(torch, signature.kv_dtype)
    dims = (q, kv, q, torch.int32, signature.head_dim, signature.head_dim, _NO_POS_ENCODING)
    specs = {}
    for window, soft_cap in signature.variants:
        if signature.tensor_core_decode:
            decode = gen_batch_prefill_module("fa2", *dims, window, soft_cap, False)
        else:
            decode = gen_batch_decode_module(*dims, window, soft_cap)
        prefill = gen_batch_prefill_module(
            signature.prefill_backend, *dims, window, soft_cap, False
        )
        specs[decode.name], specs[prefill.name] = decode, prefill
    return list(specs.values())


def missing(specs: list[Any]) -> list[Any]:
    """The specs neither prebuilt (flashinfer-jit-cache) nor in the JIT cache."""
    return [spec for spec in specs if not (spec.is_aot or spec.is_compiled)]


def build(specs: list[Any]) -> float:
    """Build every spec in one ninja run (FlashInfer's `build_jit_specs`): the modules' sources
    compile side by side, and one ninja process keeps FlashInfer's one build directory's
    dependency log. A ninja per module, run side by side there, rewrote each other's logs: on
    the H200 the next process found the FA3 module's dependencies unrecorded and rebuilt it in
    its warm-up (54 s). The seconds it took."""
    start = time.perf_counter()
    if specs:
        _build_jit_specs(specs)
    return time.perf_counter() - start


def _build_jit_specs(specs: list[Any]) -> None:
    from flashinfer.jit.core import build_jit_specs

    build_jit_specs(specs, verbose=False)


def build_in_background(signature: KernelSignature) -> subprocess.Popen:
    """Start a niced process that builds the signature's modules into the JIT cache and exits;
    it logs to this process's stderr. It never initialises CUDA (the target comes from the
    signature), so it takes no GPU memory from the server beside it. A daemon thread reaps it,
    so a long-running server keeps no defunct child."""
    env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": signature.cuda_arch}
    process = subprocess.Popen(
        [sys.executable, "-m", __name__, json.dumps(asdict(signature))],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    threading.Thread(target=process.wait, name="flashinfer-build", daemon=True).start()
    return process


def _main(argv: list[str]) -> int:
    os.nice(_BACKGROUND_NICE)  # its compilers inherit it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    fields = json.loads(argv[0])
    fields["variants"] = tuple(tuple(v) for v in fields["variants"])
    todo = missing(KernelSignature(**fields).specs())
    seconds = build(todo)
    logger.info(
        "built %d FlashInfer modules in %.1fs for the next start: %s",
        len(todo),
        seconds,
        ", ".join(spec.name for spec in todo),
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
