"""ModelRunner: the model, its KV memory and its attention backend on one device.

It turns a `ModelWorkerBatch` into a `ForwardBatch`, runs the model and samples. Memory is
sized here once the network is allocated, because only then is it known what is left:
`--max-total-tokens` if given, else a fraction of what the device has.

The start runs in the order that keeps the disk busy: the network is allocated (zeroed), the KV
pool sized and allocated, the attention backend created and the CUDA graphs captured, and only
then are the weights read into the parameters (where the read's buffers fit beside the pool;
see `reads_weights_last`). A captured graph holds the parameters' addresses, not their values,
and a cold start is bound by the disk: the front end has been reading the weights into the page
cache since the process started (checkpoint_files.py), so what runs before the load runs while
the disk is still busy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from radixserve.catalog.model_tasks import task_for_model
from radixserve.distributed.parallel_state import head_shard, min_across_ranks, tp_rank, tp_size
from radixserve.forward.forward_batch import ForwardBatch
from radixserve.forward.worker_batch import ModelWorkerBatch
from radixserve.host_memory import available_memory_bytes
from radixserve.layers.attention.base import AttentionContext
from radixserve.layers.attention.registry import create_attention_backend, resolve_backend_name
from radixserve.layers.mla import mla_attention_backend
from radixserve.layers.quantization.base import resolve_quantization
from radixserve.layers.radix_attention import attention_variants
from radixserve.layers.sampler import Sampler, SamplerOutput
from radixserve.lora.manager import LoRAManager
from radixserve.lora.pool import LoRASlotPool, projection_shapes
from radixserve.mem_cache.allocator import TokenSlotAllocator
from radixserve.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixserve.mem_cache.mla_memory_pool import MLATokenToKVPool
from radixserve.metrics.startup import StartupPhases
from radixserve.model_executor.cuda_graph_runner import CudaGraphRunner
from radixserve.model_executor.forward_inputs import build_forward_batch
from radixserve.model_executor.future_tokens import FutureSlots, FutureTokens
from radixserve.model_executor.pooler import Pooler
from radixserve.model_loader.loader import ModelSource
from radixserve.models.registry import get_model_class
from radixserve.server_args import ServerArgs
from radixserve.utils import resolve_device

logger = logging.getLogger(__name__)

GiB = 1 << 30
MiB = 1 << 20
# On the CPU the default KV pool takes a share of the available memory, at most this much: the
# bundled model's server (both processes, weights and torch included) then stays under 2 GiB
# of RSS, with 5825 of its 45 KiB tokens (its prompts and answers, not its whole 8k context).
CPU_DEFAULT_KV_BYTES = 256 * MiB
# what the headroom holds beside the weight read's own buffers when the read runs after the
# graphs were captured: the graphs' memory pool and the attention backend's workspace
LOAD_MARGIN_BYTES = 1 * GiB
KV_CACHE_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn}


def kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """--kv-cache-dtype: auto stores K/V in the model dtype."""
    return model_dtype if name == "auto" else KV_CACHE_DTYPES[name]


class TimedIterator:
    """Counts the time spent producing items (reading weights), apart from the time the
    consumer spends on them (copying them into parameters)."""

    def __init__(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._items = iter(items)
        self.seconds = 0.0

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        start = time.perf_counter()
        try:
            return next(self._items)
        finally:
            self.seconds += time.perf_counter() - start


def parameter_addresses(model: torch.nn.Module) -> dict[str, int]:
    return {name: p.data_ptr() for name, p in model.named_parameters()}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of this rank's parameters and buffers (works on a meta-device model)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def weights_fit_problem(need: int, free: int, total: int, device: str) -> str | None:
    """Why weights of `need` bytes cannot be loaded into `free` of `total` device bytes, or None.

    The KV cache and CUDA graphs need room too, but their sizing has its own error (see
    `_kv_capacity`); this one is about the weights alone."""
    if need <= free:
        return None
    return (
        f"the model does not fit on {device}: its weights need {need / GiB:.2f} GiB on each GPU "
        f"and {free / GiB:.2f} GiB of the device's {total / GiB:.2f} GiB are free; shard it over "
        "more GPUs with --tp-size, choose a smaller --dtype, or a smaller model"
    )


def reads_weights_last(
    kv_in_model_dtype: bool, load_bytes: int, total: int, mem_fraction_static: float
) -> bool:
    """Whether the weights are read after the KV pool is allocated and the graphs captured
    (while the disk is still busy with the read-ahead): where the read's buffers (`load_bytes`,
    plus a margin) fit in the headroom `--mem-fraction-static` leaves beside weights and pool,
    which serving's activations use only later. Elsewhere (a small GPU) the read goes first, as
    the pool must not shrink for a faster start. An FP8 KV cache also reads first: its
    checkpoint scales are baked into the captured graphs as numbers."""
    headroom = total * (1.0 - mem_fraction_static)
    return kv_in_model_dtype and load_bytes + LOAD_MARGIN_BYTES <= headroom


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [bs, vocab] float32
    forward_batch: ForwardBatch
    # a replayed decode graph's greedy choice per row, already stored in the row's future
    # slot: what the sampler would pick for a batch of plain greedy rows
    greedy_ids: torch.Tensor | None = None


class ModelRunner:
    def __init__(
        self, server_args: ServerArgs, source: ModelSource, startup: StartupPhases | None = None
    ) -> None:
        """`startup` collects the time of each start-up phase (a fresh one if not given)."""
        self.server_args = server_args
        self.model_config = source.config
        self.device = torch.device(resolve_device(server_args.device))
        self.dtype = source.config.dtype
        self.kv_dtype = kv_cache_dtype(server_args.kv_cache_dtype, self.dtype)
        torch.manual_seed(server_args.random_seed)
        self.startup = startup or StartupPhases()

        self.quantization = resolve_quantization(source.config.hf_config, server_args.quantization)
        hf_config = source.config.hf_config
        self.task = task_for_model(server_args.task, server_args.model, hf_config.to_dict())
        if self.task.pools and self.task.head != "yes_no":
            # no LM head to hold: a pooling checkpoint has none of its own (tying it to the
            # embedding is the loader's way of expecting none)
            hf_config.tie_word_embeddings = True
        with self.startup.timed("model_setup"):
            self.model = self._build_model()
            # before the KV pool is sized: the pool takes what the adapters' slots leave
            self.lora = self._build_lora() if server_args.lora_enabled else None
            self.pooler = self._build_pooler(source) if self.task.pools else None
        weights_last = self.device.type != "cuda" or reads_weights_last(
            self.kv_dtype == self.dtype,
            source.load_device_bytes
            + (self.quantization.load_working_bytes(self.model) if self.quantization else 0),
            torch.cuda.mem_get_info(self.device)[1],
            server_args.mem_fraction_static,
        )
        if not weights_last:
            self._load_weights(source)
        with self.startup.timed("kv_allocation"):
            # every rank must schedule identically: agree on the smallest capacity
            self.max_total_tokens = min_across_ranks(self._kv_capacity())
            self.max_running_requests = server_args.max_running_requests or (
                256 if self.device.type == "cuda" else 64
            )
            cfg = self.model_config
            # a pooling model's requests end with their prefill and hold their rows until it is
            # resolved: under overlap the next batch forms (and takes its rows) while the last
            # one runs, so two batches' rows
            batches = 2 if self.pooler is not None else 1
            self.req_to_token_pool = ReqToTokenPool(
                batches * self.max_running_requests + 2, cfg.context_len + 8, self.device
            )
            self.token_to_kv_pool = self._build_kv_pool()
            if self.token_to_kv_pool.is_fp8:
                for layer, (k_scale, v_scale) in self.model.kv_cache_scales.items():
                    self.token_to_kv_pool.set_scales(layer, k_scale, v_scale)
            self.allocator = TokenSlotAllocator(self.max_total_tokens)
        with self.startup.timed("attention_backend"):
            context = self.attention_context()
            requested = server_args.attention_backend
            if self.mla_cache_dims is not None:
                requested = mla_attention_backend(requested, self.device.type)
            self.attention_backend_name = resolve_backend_name(requested, self.device.type, context)
            self.attn_backend = create_attention_backend(self.attention_backend_name, context)
        self.sampler = Sampler()
        self.future_tokens = FutureTokens(self.max_running_requests + 2, self.device)
        self.cuda_graph_runner: CudaGraphRunner | None = None
        if (
            self.device.type == "cuda"
            and not server_args.disable_cuda_graph
            and self.pooler is None  # pooling runs prefills only: nothing to replay
            and self.attn_backend.supports_cuda_graph
        ):
            with self.startup.timed("cuda_graph_capture"):
                self.cuda_graph_runner = CudaGraphRunner(
                    self.model,
                    self.attn_backend,
                    self.req_to_token_pool,
                    self.token_to_kv_pool,
                    self.future_tokens,
                    max_bs=min(server_args.cuda_graph_max_bs, self.max_running_requests),
                    lora_batch=self.lora.pool.batch if self.lora is not None else None,
                )
        if weights_last:
            self._load_weights(source)

    def _load_weights(self, source: ModelSource) -> None:
        """Stream the checkpoint into the parameters, in place: anything captured or planned
        before holds their addresses (this raises if the load moved one)."""
        addresses = parameter_addresses(self.model)
        start = time.perf_counter()
        weights = TimedIterator(source.weights())
        self.model.load_weights(self.pooler.take_head_weights(weights) if self.pooler else weights)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            # the reader's transient buffers go back to the device
            torch.cuda.empty_cache()
        self.startup.add("weight_read", weights.seconds)
        self.startup.add("host_to_device", time.perf_counter() - start - weights.seconds)
        moved = sorted(n for n, a in parameter_addresses(self.model).items() if addresses[n] != a)
        if moved:
            raise RuntimeError(
                f"loading the weights replaced {len(moved)} parameters instead of writing into "
                f"them (e.g. {moved[:3]}): CUDA graphs captured before would read freed memory"
            )

    def _build_model(self) -> torch.nn.Module:
        """The network on the device, its parameters allocated and zeroed (a pass over them
        before the weights arrive, as graph capture runs, computes finite values), not yet
        loaded."""
        model_cls = get_model_class(self.model_config.architecture)
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            if self.device.type == "cuda":
                # sized on the meta device first: a model that cannot fit fails here, clearly,
                # instead of with an allocator error halfway through loading
                with torch.device("meta"):
                    need = weight_bytes(model_cls(self.model_config.hf_config, self.quantization))
                free, total = torch.cuda.mem_get_info(self.device)
                problem = weights_fit_problem(need, free, total, str(self.device))
                if problem is not None:
                    raise RuntimeError(problem)
            with torch.device(self.device):
                return model_cls(self.model_config.hf_config, self.quantization).eval()
        finally:
            torch.set_default_dtype(default_dtype)

    def _build_lora(self) -> LoRAManager:
        """The adapters' device slots (wrapping the model's projections) and their manager."""
        args = self.server_args
        if self.task.pools:
            raise ValueError("LoRA adapters are served for generation only (--task generate)")
        max_rows = (args.max_running_requests or (256 if self.device.type == "cuda" else 64)) + 2
        pool = LoRASlotPool(
            self.model, args.max_loras, args.max_lora_rank, max_rows, self.dtype, self.device
        )
        hf_config = self.model_config.hf_config
        logger.info(
            "LoRA: %d slots of rank %d take %.1f MiB",
            args.max_loras,
            args.max_lora_rank,
            pool.nbytes / MiB,
        )
        return LoRAManager(
            pool,
            args.max_cpu_loras,
            hf_config.num_hidden_layers,
            projection_shapes(hf_config),
            self.dtype,
            lockstep=tp_size() > 1,
        )

    def _prepare_lora(self, batch: ModelWorkerBatch, padded: int | None) -> None:
        """The pass's adapter layout: one segment per request (its extend tokens, or its decode
        token); a replayed graph's padding rows use none. A pass without adapter rows is
        inactive: the eager layers skip the LoRA products, a replay takes the graph without
        them."""
        assert self.lora is not None
        slots = batch.lora_slots or [-1] * len(batch.seq_lens)
        if padded is not None:
            rows = len(slots)
            self.lora.pool.batch.prepare(slots + [-1] * (padded - rows), [1] * padded)
        elif batch.forward_mode.is_decode():
            self.lora.pool.batch.prepare(slots, [1] * len(slots))
        else:
            self.lora.pool.batch.prepare(slots, batch.extend_seq_lens)

    def _build_pooler(self, source: ModelSource) -> Pooler:
        """The pooling head of an embed or rerank model; a causal LM scored by its "yes" and
        "no" tokens needs both in its vocabulary, as single tokens."""
        yes_no = None
        if self.task.head == "yes_no":
            vocab = source.tokenizer.get_vocab() if source.tokenizer is not None else {}
            if "yes" not in vocab or "no" not in vocab:
                raise RuntimeError(
                    "--task rerank scores a causal LM by its 'yes' and 'no' tokens, and this "
                    "model's tokenizer has no such tokens"
                )
            yes_no = (vocab["yes"], vocab["no"])
        pooler = Pooler(self.task, self.model_config.hidden_size, yes_no)
        return pooler.to(self.device, torch.float32).eval()

    def attention_context(self) -> AttentionContext:
        cfg = self.model_config
        shard = head_shard(cfg.num_attention_heads, cfg.num_key_value_heads, tp_rank(), tp_size())
        return AttentionContext(
            device=self.device,
            dtype=self.dtype,
            kv_dtype=self.token_to_kv_pool.dtype,
            num_heads=shard.q_count,
            num_kv_heads=self.token_to_kv_pool.num_kv_heads,
            head_dim=self.token_to_kv_pool.head_dim,
            req_to_token=self.req_to_token_pool.req_to_token,
            variants=attention_variants(self.model),
        )

    @property
    def local_kv_heads(self) -> int:
        """KV heads this rank stores (all of them without tensor parallelism)."""
        return self.model.model.layers[0].self_attn.num_kv_heads

    @property
    def mla_cache_dims(self) -> tuple[int, int] | None:
        """(kv_lora_rank, rope_dim) of a model with multi-head latent attention (DeepSeek),
        whose pool holds one latent row per token and layer; None for K/V heads."""
        return getattr(self.model, "mla_cache_dims", None)

    @property
    def kv_bytes_per_token(self) -> int:
        """Device bytes one KV slot costs across all layers: sizes --max-total-tokens."""
        cfg = self.model_config
        if self.mla_cache_dims is not None:
            return MLATokenToKVPool.latent_bytes_per_token(
                cfg.num_hidden_layers, *self.mla_cache_dims, self.kv_dtype
            )
        return TokenToKVPool.bytes_per_token(
            cfg.num_hidden_layers, self.local_kv_heads, cfg.head_dim, self.kv_dtype
        )

    def _build_kv_pool(self) -> TokenToKVPool:
        cfg = self.model_config
        if self.mla_cache_dims is not None:
            return MLATokenToKVPool(
                self.max_total_tokens,
                cfg.num_hidden_layers,
                *self.mla_cache_dims,
                self.kv_dtype,
                self.device,
            )
        return TokenToKVPool(
            self.max_total_tokens,
            cfg.num_hidden_layers,
            self.local_kv_heads,
            cfg.head_dim,
            self.kv_dtype,
            self.device,
        )

    def _kv_capacity(self) -> int:
        per_token = self.kv_bytes_per_token
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - total * (1.0 - self.server_args.mem_fraction_static)
        else:
            budget = available_memory_bytes() * self.server_args.mem_fraction_static * 0.5
        fits = int(budget // per_token)
        requested = self.server_args.max_total_tokens
        if requested is None:
            requested = (
                fits if self.device.type == "cuda" else min(fits, CPU_DEFAULT_KV_BYTES // per_token)
            )
        if fits < requested or requested < 1:
            raise RuntimeError(
                f"not enough memory for the KV cache: {requested} tokens need "
                f"{requested * per_token / GiB:.2f} GiB, {max(budget, 0) / GiB:.2f} GiB left after "
                f"the weights at --mem-fraction-static {self.server_args.mem_fraction_static}; "
                "lower --max-total-tokens or raise --mem-fraction-static"
            )
        return requested

    def forward(self, batch: ModelWorkerBatch, future: FutureSlots) -> ForwardOutput:
        """One pass; `future` holds the slots reserved for the batch's sampled tokens."""
        graphs = self.cuda_graph_runner
        restore = batch.kv_restore
        if graphs is not None and graphs.can_run(batch):
            if restore is not None:  # a graph cannot wait layer by layer: all of it first
                restore.wait_all()
            if self.lora is not None:
                self._prepare_lora(batch, graphs.padded_size(len(batch.seq_lens)))
            forward_batch = graphs.load_inputs(batch, future)
            logits, greedy_ids = graphs.replay(forward_batch, len(batch.seq_lens))
            return ForwardOutput(logits, forward_batch, greedy_ids)
        forward_batch = build_forward_batch(
            batch,
            self.req_to_token_pool,
            self.token_to_kv_pool,
            self.attn_backend,
            self.device,
            future,
        )
        if batch.has_future_ids:
            forward_batch.input_ids = self.future_tokens.resolve(forward_batch.input_ids)
        if self.lora is not None:
            self._prepare_lora(batch, None)
        self.attn_backend.init_forward_metadata(forward_batch)
        forward_batch.kv_restore = restore
        logits = self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)
        if restore is not None:  # whatever a model's layers waited for, later work waits for all
            restore.wait_all()
        return ForwardOutput(logits, forward_batch)

    def pool(self, batch: ModelWorkerBatch, future: FutureSlots) -> torch.Tensor:
        """One extend pass of an embed or rerank model: its rows' pooled outputs (pooler.py)."""
        assert self.pooler is not None and batch.forward_mode.is_extend()
        if batch.kv_restore is not None:
            batch.kv_restore.wait_all()
        forward_batch = build_forward_batch(
            batch,
            self.req_to_token_pool,
            self.token_to_kv_pool,
            self.attn_backend,
            self.device,
            future,
        )
        self.attn_backend.init_forward_metadata(forward_batch)
        with torch.no_grad():
            hidden = self.model.model(
                forward_batch.input_ids, forward_batch.positions, forward_batch
            )
        return self.pooler(self.model, hidden, forward_batch)

    def sample(self, logits: torch.Tensor, forward_batch: ForwardBatch) -> SamplerOutput:
        return self.sampler(
            logits,
            forward_batch.sampling_info,
            forward_batch.return_logprob,
            forward_batch.top_logprobs_nums,
        )
