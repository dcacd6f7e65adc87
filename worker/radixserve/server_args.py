"""Every knob of the worker in one dataclass, shared by the CLI, the Engine and the scheduler.

One place for defaults and descriptions means the CLI (`--help` included), the in-process Engine
and the operator's generated arguments cannot drift apart: `contract.py` derives
the flags from these fields. Choices that name implementations (attention backends, schedule
policies) are not listed here: they come from their registries, which that module consults.
This module imports nothing of radixserve, so every layer may read it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the --model forms that name no files: the bundled model, and random weights from a preset
BUILTIN_SMOLLM2 = "builtin:smollm2-135m"
RANDOM_PREFIX = "random:"
# Where the keys come from when their flags are not given: the operator passes the API key from
# a Secret as an environment variable, never as a command-line argument anyone can read.
API_KEY_ENV = "RADIXSERVE_API_KEY"
ADMIN_API_KEY_ENV = "RADIXSERVE_ADMIN_API_KEY"


def cache_root() -> Path:
    """Where the worker keeps what it computes once and reuses across starts (converted GGUF
    checkpoints, the start-up read-ahead's record): RADIXSERVE_CACHE_DIR (on Kubernetes the
    model-cache volume), else ~/.cache/radixserve."""
    root = os.environ.get("RADIXSERVE_CACHE_DIR") or Path.home() / ".cache" / "radixserve"
    return Path(root)


def option(default: Any, help: str, **extra: Any) -> Any:
    """A field with its CLI description (and, via `extra`, static `choices`)."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class ServerArgs:
    model: str = option(
        BUILTIN_SMOLLM2,
        "a safetensors directory, a .gguf file, a Hub repository (org/name or hf://org/name), "
        f"{BUILTIN_SMOLLM2} (the bundled SmolLM2-135M-Instruct), or random:PRESET / "
        "random:/path/config.json (random weights, for tests and benchmarks)",
    )
    served_model_name: str | None = option(
        None, "the model name clients ask for (default: derived from --model)"
    )
    task: str = option(
        "auto",
        "what the model serves: generate (text), embed (/v1/embeddings) or rerank (/v1/rerank, "
        "/v1/score); auto: from the checkpoint (a *ForSequenceClassification architecture, a "
        "sentence-transformers modules.json, a reranker's or embedding model's name; else "
        "generate)",
        choices=("auto", "generate", "embed", "rerank"),
    )
    host: str = option("0.0.0.0", "address to listen on")
    port: int = option(8000, "HTTP port")
    device: str = option("auto", "where the model runs", choices=("auto", "cpu", "cuda"))
    dtype: str = option(
        "auto",
        "weights and KV dtype (auto: the checkpoint's on CUDA, float32 on the CPU)",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    quantization: str | None = option(
        None,
        "weight quantization: fp8 quantizes a bf16/fp16 checkpoint at load (e4m3, one scale "
        "per output channel); FP8 checkpoints (quant_method fp8 or compressed-tensors) are "
        "detected from their config without it",
    )
    kv_cache_dtype: str = option(
        "auto",
        "KV cache storage: auto (the model dtype) or fp8_e4m3 (per-tensor scales, half the "
        "bytes per token: twice the tokens in the same memory)",
        choices=("auto", "fp8_e4m3"),
    )
    attention_backend: str = option(
        "auto",
        "attention kernels (auto: flashinfer if installed and this model's kernels are built, "
        "else triton while a background process builds them for the next start, where nvcc "
        "exists; CPU: torch_native)",
    )
    max_running_requests: int | None = option(
        None, "requests decoded together at most (default: 256 on CUDA, 64 on the CPU)"
    )
    max_total_tokens: int | None = option(
        None,
        "KV cache capacity in tokens (default: what --mem-fraction-static leaves; on the CPU "
        "at most 256 MiB of KV)",
    )
    context_length: int | None = option(
        None, "override the model's context length (default: the model config's)"
    )
    chunked_prefill_size: int = option(
        2048, "longest prompt piece prefilled in one pass; longer prompts go in chunks"
    )
    max_prefill_tokens: int = option(16384, "prompt tokens admitted into one prefill pass")
    mem_fraction_static: float = option(
        0.85, "fraction of device memory for weights plus KV cache (CPU: of available memory)"
    )
    schedule_policy: str = option(
        "lpm", "admission order: lpm (longest cached prefix first) or fcfs"
    )
    min_admission_batch: int = option(
        8,
        "when the running batch is full but for fewer free request slots than this and more "
        "requests wait than are free, a prefill pass waits (at most this many steps) until "
        "this many are free instead of admitting one or two as each finishes: every prefill "
        "pass costs a whole eager launch; 1 admits as soon as a slot frees",
    )
    enable_mixed_chunk: bool = option(
        False,
        "run the running batch's decode step inside a prefill pass instead of pausing decode "
        "while a long prompt is prefilled chunk by chunk",
    )
    disable_radix_cache: bool = option(False, "no prefix sharing across requests")
    kv_events_endpoint: str | None = option(
        None,
        "publish what the prefix cache stores and drops as vLLM's KV events (ZMQ PUB, msgpack) "
        "on this endpoint, e.g. tcp://*:5557, for llm-d's KV-cache indexer, Dynamo or "
        "'radixserve router --prefix-source events'; bound when its host is a wildcard (or "
        "ipc://), else connected to, e.g. tcp://epp:5557 (vLLM's rule) (default: off)",
    )
    kv_events_replay_endpoint: str | None = option(
        None,
        "a ZMQ ROUTER endpoint (e.g. tcp://*:5558) serving the last 10000 event batches by "
        "sequence number to subscribers that missed some",
    )
    kv_events_block_size: int = option(
        16, "tokens per block in KV events (and in the cache_config_info metric)"
    )
    kv_events_topic: str = option(
        "",
        "the topic frame of every KV event message; llm-d's indexer reads the pod from it "
        "(kv@POD_IP@MODEL) when the workers connect to its endpoint",
    )
    kv_host_memory: float | None = option(
        None,
        "GB of host memory for a KV tier behind the device pool: prefixes evicted from the "
        "device are kept there and copied back on a hit (pinned on CUDA; default: off)",
    )
    kv_write_policy: str = option(
        "write_back",
        "when the host tier gets a prefix: write_back (just before the device evicts it) or "
        "write_through (when the request that computed it finishes)",
        choices=("write_back", "write_through"),
    )
    kv_disk_path: str | None = option(
        None,
        "a directory for a disk KV tier behind the host tier: whole blocks of finished "
        "requests' KV, found again by a restarted worker with the same model and settings "
        "(needs --kv-host-memory; default: off)",
    )
    kv_disk_size: float = option(64.0, "GB the disk KV tier may fill; oldest blocks go first")
    disable_cuda_graph: bool = option(False, "launch decode kernels eagerly (no CUDA graphs)")
    cuda_graph_max_bs: int = option(
        256, "largest decode batch captured in a CUDA graph; bigger batches run eagerly"
    )
    disable_overlap: bool = option(
        False, "resolve each batch before forming the next (no overlap scheduling)"
    )
    tp_size: int = option(1, "tensor-parallel ranks (one GPU each)")
    speculative_method: str | None = option(
        None,
        "speculative decoding: ngram (prompt lookup over the request's own prompt and output) "
        "or draft (a small model with the same tokenizer, --speculative-draft-model); the "
        "target checks the proposed tokens in one pass, so the output is what it would be "
        "without (default: off)",
    )
    speculative_num_tokens: int = option(
        4, "tokens proposed per request and step (k); the verify step scores k + 1 positions"
    )
    speculative_ngram_min: int = option(
        2, "ngram: the shortest suffix of the request's tokens that is looked up"
    )
    speculative_ngram_max: int = option(
        5, "ngram: the longest suffix looked up (the longest match is tried first)"
    )
    speculative_draft_model: str | None = option(
        None, "draft: the proposing model, any value --model takes (the same tokenizer)"
    )
    speculative_draft_max_tokens: int = option(
        65536, "draft: the draft model's KV pool, in tokens (its own, beside the target's)"
    )
    speculative_max_batch_size: int = option(
        16,
        "speculate only while the running batch has at most this many requests: above it the "
        "step is compute-bound and plain decode (CUDA graphs, overlap) is faster",
    )
    max_queued_requests: int = option(
        1024, "requests waiting for admission before new ones get 429"
    )
    grammar_compile_timeout: float = option(
        30.0,
        "seconds a grammar (json_schema, regex, ebnf) may take to compile; a longer compile is "
        "killed and its requests get a 400",
    )
    max_concurrent_grammar_compiles: int = option(
        4, "distinct grammars compiled at once, each in a worker process; others wait their turn"
    )
    grammar_cache_mb: int = option(
        512, "memory of compiled grammars kept for reuse (MiB); least recently used go first"
    )
    drain_timeout: float = option(30.0, "seconds in-flight requests get to finish after SIGTERM")
    scheduler_stall_timeout: float = option(
        30.0,
        "seconds the scheduler loop may go without a step or an idle heartbeat before /ready "
        "answers 503 (a wedged scheduler; a busy one keeps stepping)",
    )
    watchdog_timeout: float = option(
        300.0,
        "seconds a scheduler step may go without completing while requests are pending before "
        "the worker counts as hung: the scheduler dumps every thread's stack to the log and "
        "exits, the server exits non-zero (a pod restarts), and /health answers 503 meanwhile "
        "(0: off)",
    )
    random_seed: int = option(0, "seed of weights from random:, and of unseeded sampling")
    log_level: str = option(
        "info", "log level", choices=("debug", "info", "warning", "error", "critical")
    )
    log_format: str = option(
        "plain",
        "log lines as plain text or as one JSON object each, for every worker process",
        choices=("plain", "json"),
    )
    log_requests: bool = option(
        False,
        "log one line per finished generation request: its id, model, prompt, completion and "
        "cached tokens, finish reason, time to first token, end-to-end latency and HTTP status",
    )
    tool_call_parser: str | None = option(
        None,
        "how the model writes tool calls (default: recognised from the model's chat template; "
        "hermes for models whose template has no tool support)",
    )
    reasoning_parser: str | None = option(
        None,
        "split the model's reasoning into reasoning_content: <think> blocks, or gpt-oss's "
        "harmony analysis channel (default: harmony for gpt-oss, recognised from its chat "
        "template; off otherwise)",
    )
    strict_api: bool = option(
        False,
        "refuse requests with fields the server does not know (default: ignore them, with one "
        "warning per field name)",
    )
    responses_store_size: int = option(
        1024,
        "responses /v1/responses keeps (store: true, the default) for previous_response_id, "
        "GET and DELETE, at most; the least recently used go first (0: none are kept). Kept "
        "by this worker only: behind a router, continue a response on the worker that made it",
    )
    responses_store_dir: str | None = option(
        None,
        "keep stored responses as JSON files in this directory, so that they survive restarts "
        "(default: in memory); one worker per directory",
    )
    api_key: str | None = option(
        None,
        "clients must send 'Authorization: Bearer KEY' to every endpoint but /health, "
        f"/ready and /metrics (default: ${API_KEY_ENV}; unset: no key needed)",
    )
    admin_api_key: str | None = option(
        None,
        "the key for /flush_cache and /get_server_info "
        f"(default: ${ADMIN_API_KEY_ENV}, else the API key)",
    )
    new_token_ratio: float = option(
        0.7,
        "fraction of a running request's remaining max_new_tokens that admission reserves; "
        "retraction corrects the optimism of a value below 1",
    )
    lora_modules: list[str] | None = option(
        None,
        "a LoRA adapter served at start, NAME=PATH (repeatable): a PEFT directory or a Hub repo "
        "in the local cache; clients select it with model: NAME",
        repeatable=True,
    )
    lora_modules_file: str | None = option(
        None,
        "a file of LoRA adapters served at start, one NAME=PATH a line (blank and # lines "
        "skipped), read when the engine starts: the operator's ConfigMap, which it keeps current "
        "while the pod runs, so a restarted pod serves the present list",
    )
    max_loras: int = option(
        0,
        "LoRA adapters resident on the device at once (slots); 0: 4 when --lora-modules is "
        "given, else LoRA is off and costs nothing",
    )
    lora_load: str = option(
        "eager",
        "when an adapter's weights are read: eager, when it is given (--lora-modules, the file, "
        "the load endpoint; a bad one is refused there); lazy, on its first request (a bad one "
        "fails that request with a 400), so every adapter of a long list is served by name "
        "while only --max-cpu-loras are held in host memory",
        choices=("eager", "lazy"),
    )
    max_lora_rank: int = option(16, "the largest LoRA rank served (sizes each slot)")
    max_cpu_loras: int = option(
        16, "LoRA adapters kept in host memory (an LRU: the rest are read from disk again)"
    )

    def __post_init__(self) -> None:
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV) or None
        if self.admin_api_key is None:
            self.admin_api_key = os.environ.get(ADMIN_API_KEY_ENV) or None
        if self.served_model_name is None:
            self.served_model_name = _default_served_name(self.model)
        for name, allowed in static_choices().items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{flag_of(name)} must be one of {allowed}, got {value!r}")
        positive = (
            "port",
            "chunked_prefill_size",
            "max_prefill_tokens",
            "cuda_graph_max_bs",
            "min_admission_batch",
        )
        positive += ("tp_size", "max_queued_requests", "max_concurrent_grammar_compiles")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{flag_of(name)} must be positive, got {getattr(self, name)}")
        for name in ("max_running_requests", "max_total_tokens", "context_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{flag_of(name)} must be positive, got {value}")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError("--mem-fraction-static must be in (0, 1)")
        if not 0.0 < self.new_token_ratio <= 1.0:
            raise ValueError("--new-token-ratio must be in (0, 1]")
        if self.responses_store_size < 0:
            raise ValueError("--responses-store-size must not be negative (0 keeps none)")
        if self.grammar_compile_timeout <= 0:
            raise ValueError("--grammar-compile-timeout must be positive")
        if self.grammar_cache_mb < 0:
            raise ValueError("--grammar-cache-mb must not be negative")
        if self.drain_timeout < 0:
            raise ValueError("--drain-timeout must not be negative")
        if self.scheduler_stall_timeout <= 0:
            raise ValueError("--scheduler-stall-timeout must be positive")
        if self.watchdog_timeout < 0:
            raise ValueError("--watchdog-timeout must not be negative (0 turns it off)")
        self._check_speculative()
        self._check_lora()
        self._check_kv_events()
        self._check_kv_tiers()

    def _check_kv_tiers(self) -> None:
        """The host tier backs the radix cache; the disk tier backs the host tier."""
        if self.kv_host_memory is not None and self.kv_host_memory <= 0:
            raise ValueError("--kv-host-memory must be positive (GB)")
        if self.kv_disk_size <= 0:
            raise ValueError("--kv-disk-size must be positive (GB)")
        if self.kv_host_memory is not None and self.disable_radix_cache:
            raise ValueError("--kv-host-memory needs the radix cache (no --disable-radix-cache)")
        if self.kv_disk_path is not None and self.kv_host_memory is None:
            raise ValueError("--kv-disk-path needs --kv-host-memory (disk blocks load through it)")
        if self.kv_disk_path is not None and self.tp_size > 1:
            raise ValueError("--kv-disk-path serves --tp-size 1 only for now")

    def _check_kv_events(self) -> None:
        """KV events need the radix cache and real ZMQ endpoints."""
        if self.kv_events_block_size < 1:
            raise ValueError("--kv-events-block-size must be positive")
        for name in ("kv_events_endpoint", "kv_events_replay_endpoint"):
            value = getattr(self, name)
            if value is not None and "://" not in value:
                raise ValueError(f"{flag_of(name)} must be a ZMQ endpoint such as tcp://*:5557")
        if self.kv_events_replay_endpoint and not self.kv_events_endpoint:
            raise ValueError("--kv-events-replay-endpoint needs --kv-events-endpoint")
        if self.kv_events_endpoint and self.disable_radix_cache:
            raise ValueError(
                "--kv-events-endpoint needs the radix cache (no --disable-radix-cache)"
            )

    @property
    def lora_enabled(self) -> bool:
        return self.max_loras > 0

    def lora_module_paths(self) -> dict[str, str]:
        """--lora-modules and the lines of --lora-modules-file as name -> path, checked. The
        file is read here, when the engine starts, not when the flags are parsed: its list
        may change (by the operator) between the two."""
        modules = list(self.lora_modules or [])
        if self.lora_modules_file is not None:
            lines = Path(self.lora_modules_file).read_text().splitlines()
            modules += [line.strip() for line in lines if line.strip()[:1] not in ("", "#")]
        return self._checked_modules(modules)

    def _checked_modules(self, modules: list[str]) -> dict[str, str]:
        """Adapter names are model names: NAME=PATH, distinct, not the base model's."""
        for module in modules:
            name, _, path = module.partition("=")
            if not name or not path:
                raise ValueError(f"--lora-modules takes NAME=PATH, got {module!r}")
        names = [module.partition("=")[0] for module in modules]
        if len(set(names)) != len(names) or self.served_model_name in names:
            raise ValueError("--lora-modules names must be distinct and not the base model's")
        return dict(module.split("=", 1) for module in modules)

    def _check_lora(self) -> None:
        """--lora-modules checked; the file's lines are checked when read (at engine start)."""
        names = list(self._checked_modules(list(self.lora_modules or [])))
        if self.max_loras < 0 or self.max_lora_rank < 1 or self.max_cpu_loras < 1:
            raise ValueError("--max-loras >= 0, --max-lora-rank and --max-cpu-loras >= 1")
        if (self.lora_modules or self.lora_modules_file) and self.max_loras == 0:
            self.max_loras = 4
        if len(names) > self.max_cpu_loras and self.lora_load == "eager":
            self.max_cpu_loras = len(names)  # the flag's adapters, checked at start, stay read

    def _check_speculative(self) -> None:
        """The speculative flags agree with each other (method, its model, its bounds)."""
        method = self.speculative_method
        if method is not None and method not in SPECULATIVE_METHODS:
            raise ValueError(f"--speculative-method must be one of {SPECULATIVE_METHODS}")
        if (method == "draft") != (self.speculative_draft_model is not None):
            raise ValueError(
                "--speculative-draft-model goes with --speculative-method draft, and only with it"
            )
        if self.speculative_draft_max_tokens < 1:
            raise ValueError("--speculative-draft-max-tokens must be positive")
        if not 1 <= self.speculative_num_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"--speculative-num-tokens must be in [1, {MAX_SPECULATIVE_TOKENS}]")
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise ValueError(
                "--speculative-ngram-min must be positive and at most --speculative-ngram-max"
            )
        if self.speculative_max_batch_size < 1:
            raise ValueError("--speculative-max-batch-size must be positive")

    def public_dict(self) -> dict[str, Any]:
        """Every field, keys redacted: what introspection endpoints may show."""
        values = dataclasses.asdict(self)
        for name in SECRET_FIELDS:
            if values[name] is not None:
                values[name] = "<redacted>"
        return values


SECRET_FIELDS = ("api_key", "admin_api_key")
# --speculative-method's values, and the most tokens one step may propose per request
SPECULATIVE_METHODS = ("ngram", "draft")
MAX_SPECULATIVE_TOKENS = 16


def static_choices() -> dict[str, tuple[str, ...]]:
    """Fields whose allowed values are fixed here (registry-backed ones are not)."""
    from dataclasses import fields

    return {f.name: f.metadata["choices"] for f in fields(ServerArgs) if "choices" in f.metadata}


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _default_served_name(model: str) -> str:
    if model == BUILTIN_SMOLLM2:
        return "smollm2-135m"
    if model.startswith(RANDOM_PREFIX):
        return model
    return model.rstrip("/").split("/")[-1].removesuffix(".gguf")
