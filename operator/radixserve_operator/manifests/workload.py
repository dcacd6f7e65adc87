"""The worker Deployment: args from ``engine``, model volumes, probes, GPU-safe rollout.

Worker pods meet the ``restricted`` Pod Security Standard, so they run in namespaces that
enforce it: a non-root user (the image's, uid 10001), no privilege escalation, no
capabilities, the runtime's default seccomp profile, no service-account token (the worker
never calls the API) and a read-only root filesystem. Everything the worker writes lives on a
volume: scratch files (IPC sockets) on ``/tmp``, and the Hub download cache, the converted
tokenizer and the compiled kernels (Triton, FlashInfer, the CUDA driver's) on the model-cache
volume, so a later pod on the same claim starts with its kernels already built.
"""

from __future__ import annotations

import math
from typing import Any

from radixserve_operator.manifests.lora import (
    LORA_MODULES_FILE,
    LORA_MOUNT,
    MODEL_CACHE_MOUNT,
    lora_config_map_name,
)
from radixserve_operator.manifests.meta import (
    HTTP_PORT_NAME,
    Owner,
    cli_flags,
    common_labels,
    object_meta,
    selector_labels,
    worker_ports,
)
from radixserve_operator.spec import (
    API_KEY_ENV,
    DEFAULT_MAX_LORAS,
    DEFAULT_PORT,
    Engine,
    LoRA,
    ModelSource,
    ServiceSpec,
)

MODEL_SOURCE_MOUNT = "/models/source"
SCRATCH_MOUNT = "/tmp"
# The worker image's unprivileged user (the Dockerfile's `useradd --uid 10001`).
WORKER_UID = 10001
# Where each writer's cache goes; a name the user sets in spec.env wins.
CACHE_ENV = {
    "HF_HOME": MODEL_CACHE_MOUNT,
    "RADIXSERVE_CACHE_DIR": f"{MODEL_CACHE_MOUNT}/radixserve",
    "TRITON_CACHE_DIR": f"{MODEL_CACHE_MOUNT}/triton",
    # FlashInfer appends .cache/flashinfer/<version>/<arch> to this base.
    "FLASHINFER_WORKSPACE_BASE": f"{MODEL_CACHE_MOUNT}/flashinfer",
    "CUDA_CACHE_PATH": f"{MODEL_CACHE_MOUNT}/cuda",
    # Anything else that writes under $HOME lands on the scratch volume.
    "HOME": SCRATCH_MOUNT,
}
# The disk KV tier (engine.kvDiskSize): on a claim it outlives the pod, so a rolled-out worker
# starts with the prefixes its predecessors wrote (they share it: blocks are content-named).
KV_DISK_DIR = f"{MODEL_CACHE_MOUNT}/kv-cache"
STARTUP_PROBE_PERIOD_SECONDS = 10
# Time the kubelet gives after preStop + drain before SIGKILL: process exit and log flush.
GRACE_MARGIN_SECONDS = 10


def build_deployment(owner: Owner, spec: ServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(owner),
        "spec": {
            "replicas": spec.desired_replicas,
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": spec.lifecycle.startup_timeout_seconds + 600,
            "selector": {"matchLabels": selector_labels(owner)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": spec.rollout.max_surge,
                    "maxUnavailable": spec.rollout.max_unavailable,
                },
            },
            "template": _pod_template(owner, spec),
        },
    }


def worker_args(spec: ServiceSpec) -> list[str]:
    """The ``radixserve serve`` command line for this spec (the worker's CLI contract), its
    values joined to their flags (``cli_flags``)."""
    valued: list[tuple[str, object]] = [
        ("--model", _model_argument(spec.model)),
        ("--host", "0.0.0.0"),
        ("--port", DEFAULT_PORT),
        ("--device", "cuda" if spec.resources.gpu > 0 else "cpu"),
        ("--served-model-name", spec.model.served_name),
        # the worker detects it itself unless the spec says
        ("--task", None if spec.model.task == "auto" else spec.model.task),
        ("--drain-timeout", spec.lifecycle.drain_timeout_seconds),
    ]
    return [
        "serve",
        *cli_flags(valued),
        *_engine_args(spec.engine),
        *_lora_args(spec.lora),
        *spec.engine.extra_args,
    ]


def _lora_args(lora: LoRA) -> list[str]:
    """Device slots and the ConfigMap's list, by its path, when LoRA is on (the list itself is
    not in the pod template: changing it restarts nothing); with placement onDemand the list's
    adapters are read on their first request, not at start."""
    if not lora.enabled:
        return []
    valued: list[tuple[str, object]] = [
        ("--max-loras", lora.max_loras or DEFAULT_MAX_LORAS),
        ("--lora-modules-file", LORA_MODULES_FILE),
        ("--lora-load", "lazy" if lora.on_demand else None),
    ]
    return cli_flags(valued)


def _engine_args(engine: Engine) -> list[str]:
    valued: list[tuple[str, object]] = [
        ("--tp-size", engine.tensor_parallel_size),
        ("--attention-backend", engine.attention_backend),
        ("--dtype", engine.dtype),
        ("--max-running-requests", engine.max_running_requests),
        ("--max-total-tokens", engine.max_total_tokens),
        ("--max-queued-requests", engine.max_queued_requests),
        ("--chunked-prefill-size", engine.chunked_prefill_size),
        ("--mem-fraction-static", engine.mem_fraction_static),
        ("--schedule-policy", engine.schedule_policy),
        ("--kv-host-memory", engine.kv_host_memory),
        ("--kv-disk-path", engine.kv_disk_size and KV_DISK_DIR),
        ("--kv-disk-size", engine.kv_disk_size),
        ("--speculative-method", engine.speculative and engine.speculative.method),
        ("--speculative-num-tokens", engine.speculative and engine.speculative.num_tokens),
        ("--speculative-draft-model", _draft_model_argument(engine)),
    ]
    if engine.kv_events is not None:
        replay = engine.kv_events.replay_port
        valued += [
            ("--kv-events-endpoint", f"tcp://*:{engine.kv_events.port}"),
            ("--kv-events-replay-endpoint", f"tcp://*:{replay}" if replay else None),
            ("--kv-events-block-size", engine.kv_events.block_size),
        ]
    switches = {
        "--disable-cuda-graph": not engine.cuda_graph,
        "--disable-radix-cache": not engine.radix_cache,
        "--disable-overlap": not engine.overlap_schedule,
    }
    return cli_flags(valued) + [flag for flag, on in switches.items() if on]


def _draft_model_argument(engine: Engine) -> str | None:
    """--speculative-draft-model: the draft, named as --model names the base model."""
    draft = engine.speculative.draft_model if engine.speculative else None
    return None if draft is None else _model_argument(draft)


def _model_argument(model: ModelSource) -> str:
    if model.scheme == "pvc":
        return (MODEL_SOURCE_MOUNT + model.location).rstrip("/")
    return model.location


def _pod_template(owner: Owner, spec: ServiceSpec) -> dict[str, Any]:
    volumes = _volumes(owner, spec)
    pod_spec: dict[str, Any] = {
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": WORKER_UID,
            "runAsGroup": WORKER_UID,
            "fsGroup": WORKER_UID,
            # a large cache claim is not chowned file by file at every start
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": spec.lifecycle.pre_stop_sleep_seconds
        + spec.lifecycle.drain_timeout_seconds
        + GRACE_MARGIN_SECONDS,
        "containers": [_worker_container(spec, volumes)],
        "volumes": volumes,
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    tolerations = list(spec.tolerations)
    if spec.resources.gpu > 0:
        tolerations.append(
            {"key": spec.resources.gpu_resource_name, "operator": "Exists", "effect": "NoSchedule"}
        )
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.affinity:
        pod_spec["affinity"] = dict(spec.affinity)
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    return {
        "metadata": {
            "labels": common_labels(owner),
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(DEFAULT_PORT),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": pod_spec,
    }


def _worker_container(spec: ServiceSpec, volumes: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "worker",
        "image": spec.image,
        "command": ["radixserve"],
        "args": worker_args(spec),
        "ports": [
            {"name": name, "containerPort": port, "protocol": "TCP"}
            for name, port in worker_ports(spec.engine.kv_events)
        ],
        "startupProbe": http_probe(
            "/health",
            period=STARTUP_PROBE_PERIOD_SECONDS,
            failures=math.ceil(
                spec.lifecycle.startup_timeout_seconds / STARTUP_PROBE_PERIOD_SECONDS
            ),
        ),
        "livenessProbe": http_probe("/health", period=10, failures=3),
        "readinessProbe": http_probe("/ready", period=5, failures=2),
        "lifecycle": {
            "preStop": {"exec": {"command": ["sleep", str(spec.lifecycle.pre_stop_sleep_seconds)]}}
        },
        "resources": _resources(spec),
        # a crashed worker's last log lines become its termination message, which the
        # operator shows in the service's Degraded condition
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "env": _env(spec),
        "volumeMounts": _volume_mounts(volumes),
    }
    return container


def _env(spec: ServiceSpec) -> list[dict[str, Any]]:
    """The user's env, then the cache locations (and Hub access) the user did not set."""
    wanted = dict(CACHE_ENV)
    if spec.model.scheme == "hf" or spec.lora.enabled:
        # the worker fetches hf:// checkpoints (and hf:// adapters of spec.loras) into the
        # cache volume; the image defaults to offline (so builtin: models never touch the
        # network), hf:// models must not be. With LoRA on it is set whatever the list holds,
        # so that adding an hf:// adapter leaves the pod template as it is.
        wanted["HF_HUB_OFFLINE"] = "0"
    env = list(spec.env)
    taken = {entry.get("name") for entry in env}
    env += [{"name": name, "value": value} for name, value in wanted.items() if name not in taken]
    if spec.api_key_secret is not None:
        # From the Secret through the environment: never an argument anyone can read in the
        # pod spec or the process list.
        secret = {"name": spec.api_key_secret.name, "key": spec.api_key_secret.key}
        env.append({"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": secret}})
    return env


def http_probe(path: str, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": HTTP_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _resources(spec: ServiceSpec) -> dict[str, Any]:
    requests = dict(spec.resources.requests)
    limits = dict(spec.resources.limits)
    if spec.resources.gpu > 0:
        requests[spec.resources.gpu_resource_name] = str(spec.resources.gpu)
        limits[spec.resources.gpu_resource_name] = str(spec.resources.gpu)
    return {key: value for key, value in {"requests": requests, "limits": limits}.items() if value}


def _volumes(owner: Owner, spec: ServiceSpec) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    if spec.model.scheme == "pvc":
        claim = {"claimName": spec.model.claim, "readOnly": True}
        volumes.append({"name": "model-source", "persistentVolumeClaim": claim})
    # Without a claim the caches live as long as the pod: still writable, just not shared.
    cache = (
        {"persistentVolumeClaim": {"claimName": spec.model_cache_claim}}
        if spec.model_cache_claim
        else {"emptyDir": {}}
    )
    volumes.append({"name": "model-cache", **cache})
    if spec.lora.enabled:
        config_map = {"name": lora_config_map_name(owner)}
        volumes.append({"name": "loras", "configMap": config_map})
    if spec.resources.gpu > 1:
        # NCCL between tensor-parallel ranks needs more shared memory than the 64Mi default.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    return volumes


def _volume_mounts(volumes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    mount_paths = {
        "tmp": SCRATCH_MOUNT,
        "model-source": MODEL_SOURCE_MOUNT,
        "model-cache": MODEL_CACHE_MOUNT,
        "dshm": "/dev/shm",
        "loras": LORA_MOUNT,
    }
    return [
        {
            "name": volume["name"],
            "mountPath": mount_paths[volume["name"]],
            "readOnly": volume["name"] in ("model-source", "loras"),
        }
        for volume in volumes
    ]
