"""The worker Deployment: args from ``engine``, model volumes, probes, GPU-safe rollout."""

from __future__ import annotations

import math
from typing import Any

from radixserve_operator.manifests.meta import (
    HTTP_PORT_NAME,
    Owner,
    common_labels,
    object_meta,
    selector_labels,
)
from radixserve_operator.spec import API_KEY_ENV, DEFAULT_PORT, Engine, ModelSource, ServiceSpec

MODEL_SOURCE_MOUNT = "/models/source"
MODEL_CACHE_MOUNT = "/models/cache"
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
    """The ``radixserve serve`` command line for this spec (the worker's CLI contract)."""
    args = [
        "serve",
        "--model",
        _model_argument(spec.model),
        "--host",
        "0.0.0.0",
        "--port",
        str(DEFAULT_PORT),
        "--device",
        "cuda" if spec.resources.gpu > 0 else "cpu",
        "--served-model-name",
        spec.model.served_name,
        "--drain-timeout",
        str(spec.lifecycle.drain_timeout_seconds),
    ]
    return args + _engine_args(spec.engine) + list(spec.engine.extra_args)


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
    ]
    args = [part for flag, value in valued if value is not None for part in (flag, str(value))]
    switches = {
        "--disable-cuda-graph": not engine.cuda_graph,
        "--disable-radix-cache": not engine.radix_cache,
        "--disable-overlap": not engine.overlap_schedule,
    }
    return args + [flag for flag, on in switches.items() if on]


def _model_argument(model: ModelSource) -> str:
    if model.scheme == "pvc":
        return (MODEL_SOURCE_MOUNT + model.location).rstrip("/")
    return model.location


def _pod_template(owner: Owner, spec: ServiceSpec) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": spec.lifecycle.pre_stop_sleep_seconds
        + spec.lifecycle.drain_timeout_seconds
        + GRACE_MARGIN_SECONDS,
        "containers": [_worker_container(spec)],
        "volumes": _volumes(spec),
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
    if not pod_spec["volumes"]:
        del pod_spec["volumes"]
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


def _worker_container(spec: ServiceSpec) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "worker",
        "image": spec.image,
        "command": ["radixserve"],
        "args": worker_args(spec),
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": DEFAULT_PORT, "protocol": "TCP"}],
        "startupProbe": _http_probe(
            "/health",
            period=STARTUP_PROBE_PERIOD_SECONDS,
            failures=math.ceil(
                spec.lifecycle.startup_timeout_seconds / STARTUP_PROBE_PERIOD_SECONDS
            ),
        ),
        "livenessProbe": _http_probe("/health", period=10, failures=3),
        "readinessProbe": _http_probe("/ready", period=5, failures=2),
        "lifecycle": {
            "preStop": {"exec": {"command": ["sleep", str(spec.lifecycle.pre_stop_sleep_seconds)]}}
        },
        "resources": _resources(spec),
    }
    env = list(spec.env)
    if spec.model.scheme == "hf":
        # the worker fetches hf:// checkpoints into the cache volume; the image defaults to
        # offline (so builtin: models never touch the network), hf:// models must not be
        env.append({"name": "HF_HOME", "value": MODEL_CACHE_MOUNT})
        env.append({"name": "HF_HUB_OFFLINE", "value": "0"})
    if spec.api_key_secret is not None:
        # From the Secret through the environment: never an argument anyone can read in the
        # pod spec or the process list.
        secret = {"name": spec.api_key_secret.name, "key": spec.api_key_secret.key}
        env.append({"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": secret}})
    if env:
        container["env"] = env
    mounts = _volume_mounts(spec)
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _http_probe(path: str, *, period: int, failures: int) -> dict[str, Any]:
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


def _volumes(spec: ServiceSpec) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = []
    if spec.model.scheme == "pvc":
        claim = {"claimName": spec.model.claim, "readOnly": True}
        volumes.append({"name": "model-source", "persistentVolumeClaim": claim})
    if spec.model.scheme == "hf":
        cache = (
            {"persistentVolumeClaim": {"claimName": spec.model_cache_claim}}
            if spec.model_cache_claim
            else {"emptyDir": {}}
        )
        volumes.append({"name": "model-cache", **cache})
    if spec.resources.gpu > 1:
        # NCCL between tensor-parallel ranks needs more shared memory than the 64Mi default.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    return volumes


def _volume_mounts(spec: ServiceSpec) -> list[dict[str, Any]]:
    mount_paths = {"model-source": MODEL_SOURCE_MOUNT, "model-cache": MODEL_CACHE_MOUNT}
    mounts = []
    for volume in _volumes(spec):
        name = volume["name"]
        if name == "dshm":
            mounts.append({"name": name, "mountPath": "/dev/shm"})
        else:
            mounts.append(
                {"name": name, "mountPath": mount_paths[name], "readOnly": name == "model-source"}
            )
    return mounts
