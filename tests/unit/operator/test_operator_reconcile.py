"""One reconcile pass against an in-memory API: idempotent, autoscaler-safe, optional kinds."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from radixserve_operator.reconcile import (
    OperatorContext,
    reconcile,
    refresh_status,
    refresh_worker_status,
    replicas_owned_by_other_manager,
)


class MemoryApi:
    """The KubeApi surface, storing objects in a dict; ``missing_kinds`` answer 404 (no CRD)."""

    def __init__(self, missing_kinds: tuple[str, ...] = ()) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.missing_kinds = missing_kinds
        self.writes: list[tuple[str, str]] = []
        self.applied: dict[str, dict[str, Any]] = {}

    def _check(self, kind: str) -> None:
        if kind in self.missing_kinds:
            raise ApiException(status=404, reason="Not Found")

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self._check(manifest["kind"])
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        stored = self.objects.get(key, {})
        self.applied[manifest["kind"]] = copy.deepcopy(manifest)
        merged = {**copy.deepcopy(manifest), "status": stored.get("status", {})}
        # Like server-side apply: top-level spec fields this manager omits keep their owners'.
        if "spec" in manifest:  # (ServiceAccounts, Roles and RoleBindings have none)
            merged["spec"] = {**stored.get("spec", {}), **merged["spec"]}
        merged["metadata"] = {**stored.get("metadata", {}), **manifest["metadata"]}
        if stored.get("spec") != merged.get("spec"):
            self.writes.append(("apply", manifest["kind"]))
        self.objects[key] = merged
        return copy.deepcopy(merged)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        self._check(kind)
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self.writes.append(("delete", kind))
        return self.objects.pop((kind, namespace, name), None) is not None

    def patch_status(self, namespace: str, name: str, status: dict) -> dict:
        raise AssertionError("reconcile returns the status; the handler patches it")


def service(spec: dict[str, Any], generation: int = 1, status: dict | None = None) -> dict:
    return {
        "apiVersion": "radixserve.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "svc", "namespace": "ns", "uid": "uid-1", "generation": generation},
        "spec": spec,
        "status": status or {},
    }


def context(api: MemoryApi) -> OperatorContext:
    return OperatorContext(api=api, default_image="img:1", prometheus_address="http://prom:9090")  # type: ignore[arg-type]


CPU = {"model": {"uri": "builtin:smollm2-135m"}, "replicas": 1}
AUTOSCALED = {
    "model": {"uri": "builtin:smollm2-135m"},
    "autoscaling": {"minReplicas": 1, "maxReplicas": 5},
}


def test_second_pass_changes_nothing() -> None:
    api = MemoryApi()
    first = reconcile(context(api), service(CPU), "T1")
    writes = list(api.writes)
    second = reconcile(context(api), service(CPU, status=first.status), "T2")
    assert api.writes == writes  # no spec changed on the second pass
    assert second.status == first.status
    assert second.events == []
    assert [e.reason for e in first.events] == ["Reconciled"]


def test_autoscaler_replicas_come_from_the_scale_subresource() -> None:
    api = MemoryApi()
    reconcile(context(api), service(AUTOSCALED), "T1")
    assert api.objects["Deployment", "ns", "svc"]["spec"]["replicas"] == 1  # minReplicas
    scaled = {**AUTOSCALED, "replicas": 4}  # KEDA's HPA wrote spec.replicas through /scale
    reconcile(context(api), service(scaled, generation=2), "T2")
    assert api.objects["Deployment", "ns", "svc"]["spec"]["replicas"] == 4
    assert ("ScaledObject", "ns", "svc") in api.objects


def test_replicas_owned_by_another_manager_are_left_alone() -> None:
    api = MemoryApi()
    reconcile(context(api), service(CPU), "T1")
    deployment = api.objects["Deployment", "ns", "svc"]
    deployment["spec"]["replicas"] = 7
    deployment["metadata"]["managedFields"] = [
        {"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
    ]
    assert replicas_owned_by_other_manager(deployment)
    reconcile(context(api), service({**CPU, "replicas": 2}, generation=2), "T2")
    assert "replicas" not in api.applied["Deployment"]["spec"]
    assert api.objects["Deployment", "ns", "svc"]["spec"]["replicas"] == 7


def test_missing_keda_is_degraded_but_the_rest_applies() -> None:
    api = MemoryApi(missing_kinds=("ScaledObject",))
    outcome = reconcile(context(api), service(AUTOSCALED), "T1")
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "AutoscalingUnavailable")
    assert ("Deployment", "ns", "svc") in api.objects
    assert not outcome.retry


def test_dropping_autoscaling_prunes_the_scaled_object() -> None:
    api = MemoryApi()
    reconcile(context(api), service(AUTOSCALED), "T1")
    reconcile(context(api), service(CPU, generation=2), "T2")
    assert ("ScaledObject", "ns", "svc") not in api.objects


def test_invalid_spec_applies_nothing() -> None:
    api = MemoryApi()
    bad = {
        "model": {"uri": "hf://org/m"},
        "engine": {"tensorParallelSize": 8},
        "resources": {"gpu": 4},
    }
    outcome = reconcile(context(api), service(bad), "T1")
    assert api.objects == {}
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "InvalidSpec")]
    assert outcome.status["observedGeneration"] == 1
    # Another refused edit gets its own Event; the same generation again does not.
    worse = {**bad, "resources": {"gpu": 2}}
    again = reconcile(context(api), service(worse, generation=2, status=outcome.status), "T2")
    assert [(e.type, e.reason) for e in again.events] == [("Warning", "InvalidSpec")]
    repeat = reconcile(context(api), service(worse, generation=2, status=again.status), "T3")
    assert repeat.events == []


@pytest.mark.parametrize(("status", "retry"), [(500, True), (409, True), (422, False)])
def test_apply_failures(status: int, retry: bool) -> None:
    class FailingApi(MemoryApi):
        def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
            raise ApiException(status=status, reason="nope")

    outcome = reconcile(context(FailingApi()), service(CPU), "T1")
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ApplyFailed"
    assert outcome.retry is retry


def test_refresh_status_follows_the_deployment_and_keeps_the_problem() -> None:
    api = MemoryApi()
    first = reconcile(context(api), service(CPU), "T1")
    api.objects["InferenceService", "ns", "svc"] = service(CPU, status=first.status)
    deployment = api.objects["Deployment", "ns", "svc"]
    assert refresh_status(context(api), deployment, "T2") is None  # nothing changed
    deployment["status"] = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
    parent, outcome = refresh_status(context(api), deployment, "T3")
    assert parent["metadata"]["name"] == "svc"
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert [e.reason for e in outcome.events] == ["Ready"]


def test_worker_pods_turn_the_service_degraded_and_back() -> None:
    api = MemoryApi()
    first = reconcile(context(api), service(CPU), "T1")
    api.objects["InferenceService", "ns", "svc"] = service(CPU, status=first.status)
    looping = {
        "metadata": {"name": "svc-1-a"},
        "status": {
            "containerStatuses": [
                {
                    "name": "worker",
                    "restartCount": 3,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 1, "message": "boom"}},
                }
            ]
        },
    }
    parent, outcome = refresh_worker_status(context(api), "ns", "svc", [looping], "T2")
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CrashLoopBackOff")
    assert degraded["message"].endswith("last exit code 1: boom")
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "CrashLoopBackOff")]
    api.objects["InferenceService", "ns", "svc"] = service(CPU, status=outcome.status)
    # Nothing new from the same pods; a reconcile (a spec edit) keeps the pods' problem.
    assert refresh_worker_status(context(api), "ns", "svc", [looping], "T3") is None
    kept = reconcile(context(api), api.objects["InferenceService", "ns", "svc"], "T3")
    assert next(c for c in kept.status["conditions"] if c["type"] == "Degraded") == degraded
    # The pod recovers: Degraded=False and a Recovered event.
    running = {"metadata": {"name": "svc-1-a"}, "status": {"containerStatuses": []}}
    _, recovered = refresh_worker_status(context(api), "ns", "svc", [running], "T4")
    degraded = next(c for c in recovered.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")
    assert [e.reason for e in recovered.events] == ["Recovered"]
    # A service that is gone has no status to refresh.
    assert refresh_worker_status(context(api), "ns", "other", [looping], "T5") is None
