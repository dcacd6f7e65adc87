"""The InferenceService spec as typed, validated Python values.

The API server applies the CRD's defaults and CEL rules, but the operator must not trust that
(an older CRD, a cluster without CEL, a test emulator): ``parse_spec`` re-applies the same
defaults and refuses what the CRD refuses, raising ``InvalidSpecError`` with a message fit for
a status condition. A unit test keeps these defaults equal to the CRD's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from radixserve.contract import ADMIN_API_KEY_ENV, API_KEY_ENV, all_choices
from radixserve.contract import ROUTER_POLICIES as _ROUTER_POLICY_NAMES

DEFAULT_PORT = 8000
BUILTIN_MODELS = frozenset({"smollm2-135m"})
AUTOSCALING_METRICS = ("queued", "running", "kvCacheUsage")
DEFAULT_AUTOSCALING_TARGETS = {"queued": 4.0, "running": 16.0, "kvCacheUsage": 0.8}
# the worker's own choices (its registries and ServerArgs), which the CRD's enums equal
_WORKER_CHOICES = all_choices()
ATTENTION_BACKENDS = _WORKER_CHOICES["attention_backend"]
DTYPES = _WORKER_CHOICES["dtype"]
SCHEDULE_POLICIES = _WORKER_CHOICES["schedule_policy"]
# --speculative-method (speculative decoding), and the most tokens it proposes per step
SPECULATIVE_METHODS = _WORKER_CHOICES["speculative_method"]
MAX_SPECULATIVE_TOKENS = 16
DRAFT_MODEL_WITH_DRAFT = "speculative.draftModel goes with method draft, and only with it"
# what the model serves (--task): auto (read from the checkpoint), generate, embed, rerank
MODEL_TASKS = _WORKER_CHOICES["task"]
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
ROUTER_POLICIES = _ROUTER_POLICY_NAMES  # radixserve router --policy, the CRD's enum
SCALE_TO_ZERO_NEEDS_ROUTER = (
    "autoscaling.minReplicas 0 needs router.enabled: with no worker running, only the router can"
    " take requests, hold them, and count them (radixserve_router_pending_requests) so that"
    " KEDA starts a worker"
)
KV_EVENTS_NEED_RADIX_CACHE = (
    "engine.kvEvents needs engine.radixCache: the events tell what the radix cache holds"
)
KV_EVENTS_PORTS_DIFFER = "engine.kvEvents ports must differ from each other and from 8000"
KV_HOST_MEMORY_NEEDS_RADIX_CACHE = (
    "engine.kvHostMemory needs engine.radixCache: the host KV tier keeps what the radix cache"
    " evicts"
)
KV_DISK_NEEDS_HOST_MEMORY = (
    "engine.kvDiskSize needs engine.kvHostMemory: disk blocks are read back through the host tier"
)
KV_DISK_NEEDS_ONE_GPU = "engine.kvDiskSize needs engine.tensorParallelSize 1"
_PVC_URI = re.compile(r"^pvc://(?P<claim>[a-z0-9]([-a-z0-9]*[a-z0-9])?)(?P<path>/.*)?$")
_HF_URI = re.compile(r"^hf://(?P<repo>[A-Za-z0-9][\w.-]*(/[\w.-]+)?)$")
# spec.loras: names are model names in the API (the CRD's pattern); a source is a Hub repo
# (hf://ORG/REPO[@REVISION], which the worker fetches into the Hub cache on the model-cache
# volume, as it fetches an hf:// model) or a path relative to that volume, never leaving it
LORA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
LORA_HF_SOURCE = re.compile(r"^hf://[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w.-]+)?$")
LORA_CACHE_PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*$")
LORA_PLACEMENTS = ("all", "onDemand")
MAX_LORAS = 64  # spec.loras' length and spec.maxLoras' bound (the CRD's maxItems, maximum)
DEFAULT_MAX_LORAS = 4  # --max-loras when spec.maxLoras is unset (the worker's own default)
LORA_NAME_IS_THE_MODELS = "spec.loras names must differ from the served model's name"
LORA_NEEDS_MODEL_CACHE = "spec.loras sources on the model-cache volume need spec.modelCache"


class InvalidSpecError(ValueError):
    """A spec the operator refuses to apply; the message names the field and the fix."""


@dataclass(frozen=True)
class ModelSource:
    """Where the worker loads weights from; ``scheme`` decides volumes and the --model value."""

    uri: str
    served_name: str
    scheme: str  # hf | pvc | file | builtin
    location: str  # repo id, claim path, absolute path or builtin name
    claim: str | None = None
    task: str = "auto"  # --task: auto leaves it to the worker's detection


@dataclass(frozen=True)
class Autoscaling:
    min_replicas: int
    max_replicas: int
    metric: str
    target: float
    polling_interval_seconds: int = 15
    cooldown_seconds: int = 300


@dataclass(frozen=True)
class KVEvents:
    """``engine.kvEvents`` when enabled: the worker publishes its KV events on ``port``
    (``--kv-events-endpoint tcp://*:PORT``), the Services expose it, the router reads it."""

    port: int = 5557
    replay_port: int | None = None
    block_size: int = 16


@dataclass(frozen=True)
class Speculative:
    """spec.engine.speculative: the worker's speculative decoding."""

    method: str
    num_tokens: int | None = None  # --speculative-num-tokens; the worker's default when unset
    # method draft: the proposing model, fetched like spec.model (hf://, file://, builtin:)
    draft_model: ModelSource | None = None


@dataclass(frozen=True)
class Engine:
    """Worker flags; ``None`` means: leave the worker's own default."""

    tensor_parallel_size: int | None = None
    attention_backend: str = "auto"
    dtype: str = "auto"
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    max_queued_requests: int | None = None
    chunked_prefill_size: int | None = None
    mem_fraction_static: float | None = None
    cuda_graph: bool = True
    radix_cache: bool = True
    overlap_schedule: bool = True
    schedule_policy: str = "lpm"
    kv_host_memory: float | None = None  # GB of host memory for the host KV tier
    kv_disk_size: float | None = None  # GB of the disk KV tier on the model-cache volume
    speculative: Speculative | None = None
    kv_events: KVEvents | None = None  # None: no KV events
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resources:
    gpu: int
    gpu_resource_name: str = "nvidia.com/gpu"
    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Rollout:
    max_surge: int | str
    max_unavailable: int | str


@dataclass(frozen=True)
class Lifecycle:
    startup_timeout_seconds: int = 1800
    pre_stop_sleep_seconds: int = 10
    drain_timeout_seconds: int = 30


@dataclass(frozen=True)
class SecretKeyRef:
    """One key of a Secret in the service's namespace."""

    name: str
    key: str


@dataclass(frozen=True)
class Monitoring:
    service_monitor: bool = False
    interval: str = "15s"


@dataclass(frozen=True)
class Router:
    """`radixserve router` pods in front of the workers, and optionally an InferencePool."""

    enabled: bool = False
    replicas: int = 1
    policy: str = "cache_aware"
    pending_timeout_seconds: int = 300
    inference_pool: bool = False


@dataclass(frozen=True)
class LoRAAdapter:
    """One of spec.loras: served under ``name`` (a model name) from ``source``."""

    name: str
    source: str  # hf://ORG/REPO, or a path relative to the model-cache volume


@dataclass(frozen=True)
class LoRA:
    """spec.loras, spec.loraPlacement and spec.maxLoras; ``enabled`` decides whether the
    worker serves adapters at all (off, nothing of LoRA reaches the pod)."""

    adapters: tuple[LoRAAdapter, ...] = ()
    # all: every worker reads every adapter; onDemand: every worker knows every adapter and
    # reads one on its first request (the router places them by demand)
    placement: str = "all"
    max_loras: int | None = None  # --max-loras (device slots); the worker's default when unset

    @property
    def enabled(self) -> bool:
        return bool(self.adapters) or self.placement == "onDemand" or self.max_loras is not None

    @property
    def on_demand(self) -> bool:
        """Whether the workers read adapters lazily (``--lora-load lazy``): ``onDemand``."""
        return self.enabled and self.placement == "onDemand"


@dataclass(frozen=True)
class ServiceSpec:
    """One InferenceService's desired state, defaults applied, cross-field rules checked."""

    model: ModelSource
    image: str
    replicas: int | None
    autoscaling: Autoscaling | None
    resources: Resources
    engine: Engine
    rollout: Rollout
    lifecycle: Lifecycle
    monitoring: Monitoring
    model_cache_claim: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    runtime_class_name: str | None = None
    env: tuple[Mapping[str, Any], ...] = ()
    # The worker's API key (clients send it as a Bearer token), read from a Secret.
    api_key_secret: SecretKeyRef | None = None
    router: Router = field(default_factory=Router)
    lora: LoRA = field(default_factory=LoRA)

    @property
    def admin_key(self) -> SecretKeyRef | str | None:
        """The key the workers' admin endpoints take, for the operator's adapter sync: the
        admin key spec.env gives (a value, or a Secret's key), else the API key's Secret (a
        worker without an admin key guards its admin paths with the API key), else none."""
        for var in self.env:
            if var.get("name") != ADMIN_API_KEY_ENV:
                continue
            ref = (var.get("valueFrom") or {}).get("secretKeyRef") or {}
            if ref.get("name") and ref.get("key"):
                return SecretKeyRef(name=str(ref["name"]), key=str(ref["key"]))
            return str(var.get("value") or "") or None
        return self.api_key_secret

    @property
    def desired_replicas(self) -> int:
        """Replicas for the Deployment: the user's count, or the autoscaler's via /scale."""
        if self.replicas is not None:
            return self.replicas
        if self.autoscaling is not None:
            return max(self.autoscaling.min_replicas, 1)
        return 1


def parse_spec(raw: Mapping[str, Any], *, name: str, default_image: str) -> ServiceSpec:
    """Validate and default a raw ``spec``; raises ``InvalidSpecError`` on what the CRD refuses."""
    engine = _parse_engine(_mapping(raw, "engine"))
    resources = _parse_resources(_mapping(raw, "resources"), engine)
    autoscaling = _parse_autoscaling(raw.get("autoscaling"))
    router = _parse_router(_mapping(raw, "router"))
    if autoscaling is not None and autoscaling.min_replicas == 0 and not router.enabled:
        raise InvalidSpecError(SCALE_TO_ZERO_NEEDS_ROUTER)
    replicas = _optional_int(raw, "replicas", minimum=0)
    lifecycle_raw = _mapping(raw, "lifecycle")
    monitoring_raw = _mapping(raw, "monitoring")
    cache_raw = raw.get("modelCache")
    model = _parse_model(_mapping(raw, "model"), name)
    lora = _parse_lora(raw, model.served_name)
    on_cache = [a for a in lora.adapters if not a.source.startswith("hf://")]
    if on_cache and not (cache_raw or {}).get("claimName"):
        raise InvalidSpecError(LORA_NEEDS_MODEL_CACHE)
    return ServiceSpec(
        model=model,
        image=str(raw.get("image") or default_image),
        replicas=replicas,
        autoscaling=autoscaling,
        resources=resources,
        engine=engine,
        rollout=_parse_rollout(_mapping(raw, "rollout"), gpu=resources.gpu),
        lifecycle=Lifecycle(
            startup_timeout_seconds=_int(lifecycle_raw, "startupTimeoutSeconds", 1800, minimum=10),
            pre_stop_sleep_seconds=_int(lifecycle_raw, "preStopSleepSeconds", 10, minimum=0),
            drain_timeout_seconds=_int(lifecycle_raw, "drainTimeoutSeconds", 30, minimum=0),
        ),
        monitoring=Monitoring(
            service_monitor=bool(monitoring_raw.get("serviceMonitor", False)),
            interval=str(monitoring_raw.get("interval", "15s")),
        ),
        model_cache_claim=(cache_raw or {}).get("claimName"),
        node_selector=dict(raw.get("nodeSelector") or {}),
        tolerations=tuple(raw.get("tolerations") or ()),
        affinity=raw.get("affinity"),
        runtime_class_name=raw.get("runtimeClassName"),
        env=_parse_env(raw.get("env")),
        api_key_secret=_parse_secret_ref(raw.get("apiKeySecretRef"), "spec.apiKeySecretRef"),
        router=router,
        lora=lora,
    )


def _parse_lora(raw: Mapping[str, Any], served_name: str) -> LoRA:
    """spec.loras (names distinct model names, sources in the Hub or on the cache volume),
    spec.loraPlacement and spec.maxLoras."""
    entries = raw.get("loras") or ()
    if not isinstance(entries, (list, tuple)) or len(entries) > MAX_LORAS:
        raise InvalidSpecError(f"spec.loras must be a list of at most {MAX_LORAS} adapters")
    adapters = tuple(_parse_lora_adapter(entry) for entry in entries)
    names = [adapter.name for adapter in adapters]
    if len(set(names)) != len(names):
        raise InvalidSpecError("spec.loras names must be distinct")
    if served_name in names:
        raise InvalidSpecError(LORA_NAME_IS_THE_MODELS)
    max_loras = _optional_int(raw, "maxLoras", minimum=1)
    if max_loras is not None and max_loras > MAX_LORAS:
        raise InvalidSpecError(f"spec.maxLoras must be at most {MAX_LORAS}")
    return LoRA(adapters, _choice(raw, "loraPlacement", LORA_PLACEMENTS), max_loras)


def _parse_lora_adapter(raw: Any) -> LoRAAdapter:
    if not isinstance(raw, Mapping):
        raise InvalidSpecError("spec.loras items are objects with name and source")
    name, source = raw.get("name"), raw.get("source")
    if not isinstance(name, str) or not LORA_NAME.match(name) or len(name) > 128:
        raise InvalidSpecError(f"spec.loras name {name!r} is not a model name")
    if (
        not isinstance(source, str)
        or len(source) > 512
        or not (
            LORA_HF_SOURCE.match(source)
            or (LORA_CACHE_PATH.match(source) and ".." not in source.split("/"))
        )
    ):
        raise InvalidSpecError(
            f"spec.loras source {source!r} is not hf://ORG/REPO[@REVISION] nor a path"
            " inside the model-cache volume"
        )
    return LoRAAdapter(name, source)


def _parse_router(raw: Mapping[str, Any]) -> Router:
    return Router(
        enabled=bool(raw.get("enabled", False)),
        replicas=_int(raw, "replicas", 1, minimum=1),
        policy=_choice(raw, "policy", ROUTER_POLICIES),
        pending_timeout_seconds=_int(raw, "pendingTimeoutSeconds", 300, minimum=1),
        inference_pool=bool(raw.get("inferencePool", False)),
    )


def _parse_env(raw: Any) -> tuple[Mapping[str, Any], ...]:
    env = tuple(raw or ())
    if any(isinstance(var, Mapping) and var.get("name") == API_KEY_ENV for var in env):
        raise InvalidSpecError(
            f"spec.env must not set {API_KEY_ENV}: give the key as spec.apiKeySecretRef"
        )
    return env


def _parse_secret_ref(raw: Any, where: str) -> SecretKeyRef | None:
    """A Secret's key, never its value: the worker gets it through the pod's environment."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidSpecError(f"{where} must be an object with name and key")
    name, key = raw.get("name"), raw.get("key")
    if not isinstance(name, str) or not _SECRET_NAME.match(name) or len(name) > 253:
        raise InvalidSpecError(f"{where}.name must be the name of a Secret, got {name!r}")
    if not isinstance(key, str) or not _SECRET_KEY.match(key) or len(key) > 253:
        raise InvalidSpecError(f"{where}.key must be a key of that Secret, got {key!r}")
    return SecretKeyRef(name=name, key=key)


def _parse_model(raw: Mapping[str, Any], service_name: str) -> ModelSource:
    uri = raw.get("uri")
    if not isinstance(uri, str) or not uri:
        raise InvalidSpecError("spec.model.uri is required (hf://, pvc://, file:// or builtin:)")
    served_name = str(raw.get("name") or service_name)
    task = _choice(raw, "task", MODEL_TASKS)
    source = _parse_model_uri(uri, served_name)
    return replace(source, task=task)


def _parse_model_uri(uri: str, served_name: str) -> ModelSource:
    if uri.startswith("builtin:"):
        builtin = uri.removeprefix("builtin:")
        if builtin not in BUILTIN_MODELS:
            known = ", ".join(sorted(BUILTIN_MODELS))
            raise InvalidSpecError(f"spec.model.uri: unknown builtin model {builtin!r} ({known})")
        return ModelSource(uri, served_name, "builtin", uri)
    if match := _HF_URI.match(uri):
        return ModelSource(uri, served_name, "hf", match["repo"])
    if match := _PVC_URI.match(uri):
        return ModelSource(uri, served_name, "pvc", match["path"] or "/", claim=match["claim"])
    if uri.startswith("file:///"):
        return ModelSource(uri, served_name, "file", uri.removeprefix("file://"))
    raise InvalidSpecError(
        f"spec.model.uri {uri!r} is not hf://ORG/REPO, pvc://CLAIM/PATH, file:///PATH or builtin:NAME"
    )


def _parse_speculative(engine: Mapping[str, Any]) -> Speculative | None:
    raw = engine.get("speculative")
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or "method" not in raw:
        raise InvalidSpecError("spec.engine.speculative needs a method")
    method = _choice(raw, "method", SPECULATIVE_METHODS)
    num_tokens = _optional_int(raw, "numTokens", minimum=1)
    if num_tokens is not None and num_tokens > MAX_SPECULATIVE_TOKENS:
        raise InvalidSpecError(
            f"spec.engine.speculative.numTokens must be at most {MAX_SPECULATIVE_TOKENS}"
        )
    uri = raw.get("draftModel")
    if (method == "draft") != (uri is not None):
        raise InvalidSpecError(DRAFT_MODEL_WITH_DRAFT)
    draft = None if uri is None else _parse_model_uri(str(uri), "")
    if draft is not None and draft.scheme == "pvc":
        raise InvalidSpecError(
            "spec.engine.speculative.draftModel: pvc:// is not supported (hf://, file:///, builtin:)"
        )
    return Speculative(method, num_tokens, draft)


def _parse_engine(raw: Mapping[str, Any]) -> Engine:
    extra = raw.get("extraArgs") or ()
    if not all(isinstance(arg, str) for arg in extra):
        raise InvalidSpecError("spec.engine.extraArgs must be a list of strings")
    fraction = raw.get("memFractionStatic")
    if fraction is not None and not 0 < float(fraction) < 1:
        raise InvalidSpecError("spec.engine.memFractionStatic must be between 0 and 1")
    host_memory = raw.get("kvHostMemory")
    if host_memory is not None and not float(host_memory) > 0:
        raise InvalidSpecError("spec.engine.kvHostMemory must be a positive number of GB")
    if host_memory is not None and not raw.get("radixCache", True):
        raise InvalidSpecError(KV_HOST_MEMORY_NEEDS_RADIX_CACHE)
    disk_size = raw.get("kvDiskSize")
    if disk_size is not None and not float(disk_size) > 0:
        raise InvalidSpecError("spec.engine.kvDiskSize must be a positive number of GB")
    if disk_size is not None and host_memory is None:
        raise InvalidSpecError(KV_DISK_NEEDS_HOST_MEMORY)
    if disk_size is not None and raw.get("tensorParallelSize", 1) != 1:
        raise InvalidSpecError(KV_DISK_NEEDS_ONE_GPU)
    return Engine(
        tensor_parallel_size=_optional_int(raw, "tensorParallelSize", minimum=1),
        attention_backend=_choice(raw, "attentionBackend", ATTENTION_BACKENDS),
        dtype=_choice(raw, "dtype", DTYPES),
        max_running_requests=_optional_int(raw, "maxRunningRequests", minimum=1),
        max_total_tokens=_optional_int(raw, "maxTotalTokens", minimum=1),
        max_queued_requests=_optional_int(raw, "maxQueuedRequests", minimum=1),
        chunked_prefill_size=_optional_int(raw, "chunkedPrefillSize", minimum=1),
        mem_fraction_static=None if fraction is None else float(fraction),
        cuda_graph=bool(raw.get("cudaGraph", True)),
        radix_cache=bool(raw.get("radixCache", True)),
        overlap_schedule=bool(raw.get("overlapSchedule", True)),
        schedule_policy=_choice(raw, "schedulePolicy", SCHEDULE_POLICIES),
        kv_host_memory=None if host_memory is None else float(host_memory),
        kv_disk_size=None if disk_size is None else float(disk_size),
        speculative=_parse_speculative(raw),
        kv_events=_parse_kv_events(raw),
        extra_args=tuple(extra),
    )


def _parse_kv_events(engine: Mapping[str, Any]) -> KVEvents | None:
    raw = engine.get("kvEvents") or {}
    if not raw.get("enabled", False):
        return None
    if not engine.get("radixCache", True):
        raise InvalidSpecError(KV_EVENTS_NEED_RADIX_CACHE)
    events = KVEvents(
        port=_int(raw, "port", 5557, minimum=1),
        replay_port=_optional_int(raw, "replayPort", minimum=1),
        block_size=_int(raw, "blockSize", 16, minimum=1),
    )
    ports = [DEFAULT_PORT, events.port, *([events.replay_port] if events.replay_port else [])]
    if len(set(ports)) != len(ports) or max(ports) > 65535:
        raise InvalidSpecError(KV_EVENTS_PORTS_DIFFER)
    return events


def _parse_resources(raw: Mapping[str, Any], engine: Engine) -> Resources:
    tp = engine.tensor_parallel_size
    gpu = _optional_int(raw, "gpu", minimum=0)
    if gpu is None:
        gpu = tp or 0
    if tp is not None and gpu < tp:
        raise InvalidSpecError(
            f"spec.resources.gpu ({gpu}) cannot hold engine.tensorParallelSize ({tp}):"
            f" ask for at least {tp} GPUs"
        )
    return Resources(
        gpu=gpu,
        gpu_resource_name=str(raw.get("gpuResourceName", "nvidia.com/gpu")),
        requests={k: str(v) for k, v in (raw.get("requests") or {}).items()},
        limits={k: str(v) for k, v in (raw.get("limits") or {}).items()},
    )


def _parse_autoscaling(raw: Mapping[str, Any] | None) -> Autoscaling | None:
    if raw is None:
        return None
    metric = _choice(raw, "metric", AUTOSCALING_METRICS)
    if "maxReplicas" not in raw:
        raise InvalidSpecError("spec.autoscaling.maxReplicas is required")
    min_replicas = _int(raw, "minReplicas", 1, minimum=0)
    max_replicas = _int(raw, "maxReplicas", 1, minimum=1)
    if min_replicas > max_replicas:
        raise InvalidSpecError(
            f"spec.autoscaling.minReplicas ({min_replicas}) must not exceed"
            f" maxReplicas ({max_replicas})"
        )
    target = float(raw.get("target", DEFAULT_AUTOSCALING_TARGETS[metric]))
    if target <= 0 or (metric == "kvCacheUsage" and target > 1):
        raise InvalidSpecError(f"spec.autoscaling.target {target} is out of range for {metric}")
    return Autoscaling(
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        metric=metric,
        target=target,
        polling_interval_seconds=_int(raw, "pollingIntervalSeconds", 15, minimum=1),
        cooldown_seconds=_int(raw, "cooldownSeconds", 300, minimum=0),
    )


def _parse_rollout(raw: Mapping[str, Any], *, gpu: int) -> Rollout:
    """GPU pods never surge by default: a surge pod would wait for a GPU nobody has free."""
    default_surge, default_unavailable = (0, 1) if gpu > 0 else ("25%", 0)
    max_surge = raw.get("maxSurge", default_surge)
    max_unavailable = raw.get("maxUnavailable", default_unavailable)
    if max_surge in (0, "0", "0%") and max_unavailable in (0, "0", "0%"):
        raise InvalidSpecError("spec.rollout: maxSurge and maxUnavailable cannot both be 0")
    return Rollout(max_surge=max_surge, max_unavailable=max_unavailable)


def _mapping(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, Mapping):
        raise InvalidSpecError(f"spec.{key} must be an object")
    return value


def _choice(raw: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    value = raw.get(key, allowed[0])
    if value not in allowed:
        raise InvalidSpecError(f"{key} {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _optional_int(raw: Mapping[str, Any], key: str, *, minimum: int) -> int | None:
    if raw.get(key) is None:
        return None
    return _int(raw, key, 0, minimum=minimum)


def _int(raw: Mapping[str, Any], key: str, default: int, *, minimum: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidSpecError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value
