"""The FlashInfer attention backend (the `gpu` extra): FlashInfer's paged kernels, page size 1.

FlashInfer splits the work into `plan` (host-side scheduling from the lengths, once per
forward) and `run` (per layer). So `init_forward_metadata` builds the page table of the pass
(kv_indptr from the lengths on the host, kv_indices gathered from req_to_token on the GPU by
a Triton kernel) and plans one wrapper; each layer then only stores its K/V and runs.

Extend passes use the paged prefill wrapper over prefix and new tokens alike (the new tokens'
K/V are stored first), causal with the mask aligned to the end of each request's KV, which is
exactly "query i sits at position prefix_len + i". Decode with CUDA graphs keeps one wrapper
per captured batch size over static index buffers; replay re-plans into those buffers.

FlashInfer fixes the scale, sliding window and logit soft-cap at plan time, so a model whose
layers differ in those (Gemma's local and global layers) gets one planned wrapper per
attention variant (AttentionContext.variants), all over the same page table; a layer runs
the wrapper of its variant. An FP8 pool is planned as such and run with its scales.

Attention sinks (gpt-oss) are applied to a wrapper's output with its log-sum-exp: a head's
softmax over its keys and the sink differs from the one over its keys alone by the factor
sum / (sum + exp(sink)) = sigmoid(lse - sink). That is exact, one element-wise op per layer,
captured in the decode graphs like the run, and the same for every FlashInfer wrapper and
version (the prefill and decode wrappers have no sink argument of their own on Hopper).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from radixserve.distributed.parallel_state import barrier, tp_rank
from radixserve.kernels.kv_indices import gather_kv_indices
from radixserve.layers.attention import flashinfer_kernels
from radixserve.layers.attention.base import AttentionBackend, AttentionContext
from radixserve.layers.radix_attention import AttentionVariant

if TYPE_CHECKING:
    from radixserve.forward.forward_batch import ForwardBatch
    from radixserve.layers.radix_attention import RadixAttention

_WORKSPACE_BYTES = 128 * 1024 * 1024

logger = logging.getLogger(__name__)


def _import_flashinfer() -> Any:
    try:
        import flashinfer
    except ImportError as exc:
        raise ImportError(
            "--attention-backend flashinfer needs the flashinfer-python package "
            "(pip install 'radixserve[gpu]'); or use --attention-backend triton"
        ) from exc
    return flashinfer


def _build_missing_modules(context: AttentionContext) -> None:
    """Every module this backend's plans will load, built now in one ninja run (FlashInfer
    would build each at its first plan, one after another, inside graph capture and warm-up).
    Without a compiler, missing modules fail the start here, in one line. With tensor
    parallelism, rank 0 builds for all (every rank needs the same modules, and builds side by
    side in one cache clobber each other's dependency log) while the others wait."""
    from radixserve.layers.attention.registry import flashinfer_compiler_problem

    todo = flashinfer_kernels.missing(flashinfer_kernels.KernelSignature.of(context).specs())
    names = ", ".join(spec.name for spec in todo)
    if todo and (problem := flashinfer_compiler_problem()):
        raise RuntimeError(f"--attention-backend flashinfer needs the modules {names}: {problem}")
    if todo and tp_rank() == 0:
        logger.info("building %d FlashInfer modules in one run: %s", len(todo), names)
        logger.info("built them in %.1fs", flashinfer_kernels.build(todo))
    barrier()


@dataclass
class FlashInferMetadata:
    wrappers: list[Any]  # the planned decode or prefill wrapper of each variant, this pass


def window_left(variant: AttentionVariant) -> int:
    """FlashInfer's inclusive left window (keys q - window_left .. q), -1 for none."""
    return variant.sliding_window - 1 if variant.windowed else -1


def plan_options(variant: AttentionVariant) -> dict[str, Any]:
    return {
        "sm_scale": variant.scaling,
        "window_left": window_left(variant),
        "logits_soft_cap": variant.logit_cap if variant.logit_cap > 0 else None,
    }


def with_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """out [tokens, heads, d] of a softmax over the keys alone, lse [tokens, heads] its
    log-sum-exp in base 2 (FlashInfer's), sinks [heads] natural-log logits: the output of
    the softmax that also counts the sinks."""
    keep = torch.sigmoid(lse * math.log(2.0) - sinks.float())
    return (out.float() * keep.unsqueeze(-1)).to(out.dtype)


def host_indptr(lengths: list[int] | torch.Tensor) -> torch.Tensor:
    """[0, l0, l0 + l1, ...] as int32 on the CPU: FlashInfer's plan reads it on the host."""
    lengths = torch.as_tensor(lengths, dtype=torch.int32)
    indptr = torch.zeros(lengths.numel() + 1, dtype=torch.int32)
    torch.cumsum(lengths, 0, out=indptr[1:])
    return indptr


class FlashInferAttnBackend(AttentionBackend):
    name = "flashinfer"
    decode_metadata_type = extend_metadata_type = FlashInferMetadata

    def __init__(self, context: AttentionContext) -> None:
        self._flashinfer = _import_flashinfer()
        super().__init__(context)
        self.dtype = context.dtype
        self.kv_dtype = context.kv_dtype
        self.req_to_token = context.req_to_token
        self.variants = context.planned_variants()
        self._variant_index = {variant: i for i, variant in enumerate(self.variants)}
        self.use_tensor_core_decode = flashinfer_kernels.uses_tensor_core_decode(
            self.num_heads, self.num_kv_heads
        )
        _build_missing_modules(context)
        # one float workspace for every wrapper: their runs follow each other on one stream
        self.workspace = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.decode_wrappers = [
            self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=self.use_tensor_core_decode
            )
            for _ in self.variants
        ]
        backend = flashinfer_kernels.prefill_backend(context)
        self.prefill_wrappers = [
            self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace, "NHD", backend=backend
            )
            for _ in self.variants
        ]
        self._graph_wrappers: dict[int, list[Any]] = {}
        self._graph_kv_indptr: torch.Tensor | None = None
        self._graph_kv_indices: torch.Tensor | None = None
        self._graph_last_page_len: torch.Tensor | None = None

    def _page_table(
        self,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        kv_indptr_host: torch.Tensor,
        kv_indptr: torch.Tensor | None = None,
        kv_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Gather the slots of every request into kv_indices (allocated if not given)."""
        if kv_indptr is None:
            kv_indptr = kv_indptr_host.to(self.device, non_blocking=True)
        if kv_indices is None:
            kv_indices = torch.empty(int(kv_indptr_host[-1]), dtype=torch.int32, device=self.device)
        gather_kv_indices(self.req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices)
        return kv_indices

    def _plan(
        self,
        wrappers: list[Any],
        indptrs: tuple[torch.Tensor, ...],
        kv_indices: torch.Tensor,
        **options: Any,
    ) -> None:
        """Plan each variant's wrapper over one page table: `indptrs` are (kv_indptr,) for
        decode, (qo_indptr, kv_indptr) for prefill, on the host."""
        bs = indptrs[-1].numel() - 1
        for wrapper, variant in zip(wrappers, self.variants, strict=True):
            wrapper.plan(
                *indptrs,
                kv_indices,
                torch.ones(bs, dtype=torch.int32),
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                1,
                q_data_type=self.dtype,
                kv_data_type=self.kv_dtype,
                **options,
                **plan_options(variant),
            )

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        kv_indptr_host = host_indptr(forward_batch.seq_lens_cpu)
        kv_indices = self._page_table(
            forward_batch.req_pool_indices, forward_batch.seq_lens, kv_indptr_host
        )
        if forward_batch.forward_mode.is_decode():
            self._plan(self.decode_wrappers, (kv_indptr_host,), kv_indices)
            self.forward_metadata = FlashInferMetadata(self.decode_wrappers)
            return
        qo_indptr_host = host_indptr(forward_batch.extend_seq_lens_cpu)
        self._plan(self.prefill_wrappers, (qo_indptr_host, kv_indptr_host), kv_indices, causal=True)
        self.forward_metadata = FlashInferMetadata(self.prefill_wrappers)

    def init_cuda_graph_state(self, max_bs: int) -> None:
        max_context_len = self.req_to_token.shape[1]
        self._graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self._graph_kv_indices = torch.zeros(
            max_bs * max_context_len, dtype=torch.int32, device=self.device
        )
        self._graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)

    def capture_decode_metadata(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
    ) -> FlashInferMetadata:
        if self._graph_kv_indptr is None:
            raise RuntimeError("init_cuda_graph_state must run before capture")
        # every variant's wrapper reads the same static page table
        self._graph_wrappers[bs] = [
            self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=self.use_tensor_core_decode,
                paged_kv_indptr_buffer=self._graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self._graph_kv_indices,
                paged_kv_last_page_len_buffer=self._graph_last_page_len[:bs],
            )
            for _ in self.variants
        ]
        return self.replay_decode_metadata(bs, req_pool_indices, seq_lens, seq_lens.cpu())

    def replay_decode_metadata(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor | None,
    ) -> FlashInferMetadata:
        """Plan the captured size's wrappers and refill their static page table in place;
        seq_lens_cpu (the padded lengths, on the host) spares a device-to-host sync."""
        if seq_lens_cpu is None:
            seq_lens_cpu = seq_lens[:bs].cpu()
        wrappers = self._graph_wrappers[bs]
        kv_indptr_host = host_indptr(seq_lens_cpu[:bs])
        assert self._graph_kv_indices is not None and self._graph_kv_indptr is not None
        kv_indices = self._graph_kv_indices[: int(kv_indptr_host[-1])]
        # plan copies kv_indptr into the static buffer (the gather below reads it there) and
        # leaves kv_indices alone: it is that buffer already.
        self._plan(wrappers, (kv_indptr_host,), kv_indices)
        self._page_table(
            req_pool_indices[:bs],
            seq_lens[:bs],
            kv_indptr_host,
            kv_indptr=self._graph_kv_indptr[: bs + 1],
            kv_indices=kv_indices,
        )
        return FlashInferMetadata(wrappers)

    def run_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        meta: FlashInferMetadata,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        k_scale: float,
        v_scale: float,
    ) -> torch.Tensor:
        """Decode and extend alike: the planned wrapper of the layer's variant runs over the
        pool, which holds this pass's K/V already."""
        variant = self._variant_index.get(layer.variant)
        if variant is None:
            raise ValueError(
                f"layer {layer.layer_id}'s attention {layer.variant} is not among the variants "
                f"the flashinfer backend was built for: {self.variants}"
            )
        # page size 1: [slots, kv_heads, d] is [pages, page_size=1, kv_heads, d] in NHD
        pool = forward_batch.token_to_kv_pool
        scales = {"k_scale": k_scale, "v_scale": v_scale} if pool.is_fp8 else {}
        wrapper, kv = meta.wrappers[variant], (k_buffer.unsqueeze(1), v_buffer.unsqueeze(1))
        if layer.sinks is None:
            return wrapper.run(q.contiguous(), kv, **scales)
        out, lse = wrapper.run(q.contiguous(), kv, return_lse=True, **scales)
        return with_sinks(out, lse, layer.sinks)

    run_extend = run_decode
