"""An emulated API server (kmock) and the real operator in a thread, for integration tests.

kmock's KubernetesEmulator stores objects and streams watch events but leaves API-server
semantics to the test: this subclass adds the ones the operator relies on (uid, generation
bumped on spec changes, generateName, server-side apply creating missing objects, equality
label selectors on lists, and garbage collection of owner-referenced children).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock
import kubernetes
import pytest
import yaml
from kmock import ResourceInfo

from radixserve_operator.main import OperatorConfig, run

REPO = Path(__file__).resolve().parents[3]
WAIT_SECONDS = 30.0

RESOURCES = {
    # kopf's backbone: it watches CRDs and namespaces before anything else.
    "apiextensions.k8s.io/v1/customresourcedefinitions": ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch", "get"}
    ),
    "v1/namespaces": ResourceInfo(kind="Namespace", namespaced=False, verbs={"list", "watch"}),
    "radixserve.io/v1alpha1/inferenceservices": ResourceInfo(
        kind="InferenceService",
        singular="inferenceservice",
        namespaced=True,
        verbs={"list", "watch", "get", "patch", "create", "delete", "update"},
        subresources={"status", "scale"},
    ),
    "apps/v1/deployments": ResourceInfo(
        kind="Deployment",
        namespaced=True,
        verbs={"list", "watch", "get", "patch", "create", "delete"},
    ),
    "v1/services": ResourceInfo(kind="Service", namespaced=True, verbs={"get", "patch", "delete"}),
    # spec.loras (placement all): the adapter list the worker pods mount.
    "v1/configmaps": ResourceInfo(
        kind="ConfigMap", namespaced=True, verbs={"get", "patch", "delete"}
    ),
    # spec.loras' sync reads the admin key from the Secret spec.apiKeySecretRef names.
    "v1/secrets": ResourceInfo(kind="Secret", namespaced=True, verbs={"get", "create"}),
    # Worker pods: the tests play the ReplicaSet controller and the kubelet.
    "v1/pods": ResourceInfo(
        kind="Pod",
        namespaced=True,
        verbs={"list", "watch", "get", "create", "patch", "delete"},
        subresources={"status"},
    ),
    "policy/v1/poddisruptionbudgets": ResourceInfo(
        kind="PodDisruptionBudget", namespaced=True, verbs={"get", "patch"}
    ),
    "keda.sh/v1alpha1/scaledobjects": ResourceInfo(
        kind="ScaledObject", namespaced=True, verbs={"get", "patch", "delete"}
    ),
    "kopf.dev/v1/clusterkopfpeerings": ResourceInfo(
        kind="ClusterKopfPeering",
        namespaced=False,
        verbs={"list", "watch", "get", "patch", "create"},
    ),
    "v1/events": ResourceInfo(kind="Event", namespaced=True, verbs={"create", "list"}),
    # spec.router's children, and the EndpointSlices its router watches.
    "v1/serviceaccounts": ResourceInfo(
        kind="ServiceAccount", namespaced=True, verbs={"get", "patch", "delete"}
    ),
    "rbac.authorization.k8s.io/v1/roles": ResourceInfo(
        kind="Role", namespaced=True, verbs={"get", "patch", "delete"}
    ),
    "rbac.authorization.k8s.io/v1/rolebindings": ResourceInfo(
        kind="RoleBinding", namespaced=True, verbs={"get", "patch", "delete"}
    ),
    "inference.networking.k8s.io/v1/inferencepools": ResourceInfo(
        kind="InferencePool", namespaced=True, verbs={"get", "patch", "delete"}
    ),
    "discovery.k8s.io/v1/endpointslices": ResourceInfo(
        kind="EndpointSlice",
        namespaced=True,
        verbs={"list", "watch", "get", "create", "patch", "delete"},
    ),
}


def _merge(base: Any, patch: Any) -> Any:
    """RFC 7386 merge patch (what the emulator stores), to see whether ``spec`` changed."""
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return patch
    merged = dict(base)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(base.get(key), value)
    return merged


class ApiServerEmulator(kmock.KubernetesEmulator):
    """KubernetesEmulator plus the API-server behaviour a controller depends on."""

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None and isinstance(request.data, dict):
            await self._before_write(request)
        response = await super()._handle(request)
        if request.action == kmock.action.DELETE and request.name:
            await self._collect_garbage()
        return response

    async def _before_write(self, request: kmock.Request) -> None:
        data = request.data
        meta = data.setdefault("metadata", {})
        key = (request.resource, request.namespace or meta.get("namespace"), request.name)
        if request.action == kmock.action.CREATE:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:6]
            self._stamp_new(meta, request.namespace)
        elif request.action == kmock.action.UPDATE:
            missing = key not in self.objects or self.objects[key].deleted
            if missing and "apply-patch" in request.headers.get("Content-Type", ""):
                self._stamp_new(meta, request.namespace)
                async with self._lock:
                    self.objects[key] = data
                    await self._buses[request.resource].put({"type": "ADDED", "object": data})
            elif not missing and request.subresource is None and "spec" in data:
                old = self.objects[key].raw
                if _merge(old.get("spec"), data["spec"]) != old.get("spec"):
                    meta["generation"] = old["metadata"].get("generation", 1) + 1

    async def _serve_list(self, request: kmock.Request) -> Any:
        """Lists honour an equality ``labelSelector`` (``k=v,k2=v2``), as the API server does."""
        listed = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            wanted = dict(term.split("=", 1) for term in selector.split(","))
            listed["items"] = [
                item
                for item in listed["items"]
                if wanted.items() <= (item["metadata"].get("labels") or {}).items()
            ]
        return listed

    @staticmethod
    def _stamp_new(meta: dict[str, Any], namespace: str | None) -> None:
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta.setdefault("namespace", namespace)
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        meta.setdefault("creationTimestamp", now.replace("+00:00", "Z"))

    async def _collect_garbage(self) -> None:
        """Delete objects whose every owner is gone, as the garbage collector would."""
        async with self._lock:
            live_uids = {
                obj.raw["metadata"].get("uid") for obj in self.objects.values() if not obj.deleted
            }
            for (resource, _, _), obj in list(self.objects.items()):
                if obj.deleted:
                    continue
                refs = obj.raw["metadata"].get("ownerReferences") or []
                if refs and not any(ref.get("uid") in live_uids for ref in refs):
                    raw = obj.raw
                    obj.delete()
                    await self._buses[resource].put({"type": "DELETED", "object": raw})


class ApiServer:
    """The emulator on a loopback port, served from its own thread and event loop."""

    def __init__(self) -> None:
        self.emulator: ApiServerEmulator | None = None
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),))

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        async with ApiServerEmulator() as emulator, kmock.Server(emulator) as server:
            for resource, info in RESOURCES.items():
                emulator.resources[resource] = info
            self.emulator, self.url = emulator, str(server.url).rstrip("/")
            self._started.set()
            await self._stopping.wait()

    def __enter__(self) -> ApiServer:
        self._thread.start()
        self._started.wait(WAIT_SECONDS)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._stopping is not None
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(WAIT_SECONDS)


class OperatorThread:
    """The real operator (``main.run``) in a thread, stoppable and restartable."""

    def __init__(self, config: OperatorConfig) -> None:
        self._config = config
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._target, daemon=True)

    def _target(self) -> None:
        try:
            run(self._config, stop_flag=self._stop, ready_flag=self._ready)
        except BaseException as error:  # surfaced to the test by stop()
            self.error = error

    def start(self) -> OperatorThread:
        self._thread.start()
        self._ready.wait(WAIT_SECONDS)
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_SECONDS)
        assert not self._thread.is_alive(), "the operator did not stop"
        assert self.error is None, f"the operator crashed: {self.error!r}"


def operator_config(**overrides: Any) -> OperatorConfig:
    defaults: dict[str, Any] = {
        # Cluster-wide: kmock 0.8 cannot parse GET /api/v1/namespaces, which kopf's
        # namespace-scoped mode lists (the --namespace flag is covered by unit tests).
        "namespaces": (),
        "clusterwide": True,
        "peering": None,
        "liveness_port": None,
        "metrics_port": None,
        "log_format": "plain",
        "worker_image": "radixserve:test",
        "prometheus_address": "http://prometheus.test:9090",
    }
    return OperatorConfig(**{**defaults, **overrides})


def wait_for(check: Callable[[], Any], what: str) -> Any:
    """Poll until ``check`` returns something truthy; fail with ``what`` after a generous cap."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        with contextlib.suppress(kubernetes.client.ApiException):
            result = check()
            if result:
                return result
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for: {what}")
        time.sleep(0.1)


def load_example(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "examples" / name).read_text())
