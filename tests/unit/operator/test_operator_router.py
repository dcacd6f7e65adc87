"""spec.router: the router's children, its least-privilege identity, scale from zero, the pool."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from operator_crd_checks import cel_violations, defaulted, inference_pool_problems, schema_errors
from pod_security import restricted_violations
from test_operator_manifests import OWNER, assert_valid, children
from test_operator_reconcile import MemoryApi, context, service

from radixserve.router.args import parse_router_args
from radixserve.router.policies import POLICIES
from radixserve_operator.manifests.meta import selector_labels
from radixserve_operator.manifests.router import router_child_keys, router_selector_labels
from radixserve_operator.reconcile import reconcile, refresh_status
from radixserve_operator.spec import (
    ROUTER_POLICIES,
    SCALE_TO_ZERO_NEEDS_ROUTER,
    InvalidSpecError,
    parse_spec,
)

MODEL = {"uri": "builtin:smollm2-135m", "name": "smollm2"}
ROUTED = {
    "model": MODEL,
    "autoscaling": {"minReplicas": 0, "maxReplicas": 4},
    "router": {"enabled": True, "replicas": 2, "policy": "power_of_two", "inferencePool": True},
}


def named(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_the_router_children_are_valid_kubernetes_objects() -> None:
    manifests = children(ROUTED)
    for manifest in manifests:
        assert_valid(manifest)
    assert set(named(manifests)) == {
        ("Service", "svc"),
        ("PodDisruptionBudget", "svc"),
        ("ServiceAccount", "svc-router"),
        ("Role", "svc-router"),
        ("RoleBinding", "svc-router"),
        ("Service", "svc-workers"),
        ("PodDisruptionBudget", "svc-router"),
        ("Deployment", "svc-router"),
        ("InferencePool", "svc"),
        ("ScaledObject", "svc"),
        ("Deployment", "svc"),
    }
    keys = {(m["apiVersion"], m["kind"], m["metadata"]["name"]) for m in manifests}
    assert set(router_child_keys(OWNER)) <= keys


def test_without_the_router_nothing_of_it_is_built() -> None:
    kinds = {(m["kind"], m["metadata"]["name"]) for m in children({"model": MODEL})}
    assert kinds == {("Service", "svc"), ("PodDisruptionBudget", "svc"), ("Deployment", "svc")}


def test_traffic_goes_service_to_router_to_workers_and_selectors_never_cross() -> None:
    objects = named(children(ROUTED))
    router_pods = objects["Deployment", "svc-router"]["spec"]["template"]["metadata"]["labels"]
    worker_pods = objects["Deployment", "svc"]["spec"]["template"]["metadata"]["labels"]
    front = objects["Service", "svc"]["spec"]
    assert front["type"] == "ClusterIP" and front["ports"][0]["port"] == 8000
    assert matches(front["selector"], router_pods) and not matches(front["selector"], worker_pods)
    workers = objects["Service", "svc-workers"]["spec"]
    assert workers["clusterIP"] == "None"  # headless: one endpoint per worker pod
    assert matches(workers["selector"], worker_pods)
    assert not matches(workers["selector"], router_pods)
    # The workers' Deployment and budget select their pods only, never the routers.
    for name in ("svc",):
        assert not matches(
            objects["Deployment", name]["spec"]["selector"]["matchLabels"], router_pods
        )
        assert not matches(
            objects["PodDisruptionBudget", name]["spec"]["selector"]["matchLabels"], router_pods
        )
    assert matches(
        objects["PodDisruptionBudget", "svc-router"]["spec"]["selector"]["matchLabels"],
        router_pods,
    )
    pool = objects["InferencePool", "svc"]["spec"]
    assert matches(pool["selector"]["matchLabels"], worker_pods)
    assert not matches(pool["selector"]["matchLabels"], router_pods)


def test_the_router_may_read_endpointslices_and_nothing_else_in_a_restricted_pod() -> None:
    objects = named(children(ROUTED))
    assert objects["Role", "svc-router"]["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["get", "list", "watch"]}
    ]  # fmt: skip
    binding = objects["RoleBinding", "svc-router"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "svc-router",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "svc-router", "namespace": OWNER.namespace}
    ]
    template = objects["Deployment", "svc-router"]["spec"]["template"]
    pod = template["spec"]
    assert pod["serviceAccountName"] == "svc-router"
    assert restricted_violations(pod, template["metadata"].get("annotations")) == []
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_router_command_is_one_the_router_accepts_and_finds_the_workers_service() -> None:
    deployment = named(children(ROUTED))["Deployment", "svc-router"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["radixserve"] and container["args"][0] == "router"
    args = parse_router_args(container["args"][1:])  # the router's own parser
    assert args.policy == "power_of_two" and args.model_name == "smollm2"
    assert args.discover_selector == "kubernetes.io/service-name=svc-workers"
    assert (args.namespace, args.discover_port, args.port) == (OWNER.namespace, "http", 8000)
    assert args.pending_timeout == 300
    assert deployment["spec"]["replicas"] == 2
    # Readiness is /health: a router with no worker must keep taking (and holding) requests.
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    pod = deployment["spec"]["template"]["spec"]
    drain = parse_spec(ROUTED, name="svc", default_image="i").lifecycle.drain_timeout_seconds
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > sleep + drain
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_the_crd_and_the_router_agree_on_the_policies() -> None:
    assert tuple(POLICIES) == ROUTER_POLICIES


def test_keda_gets_a_router_pending_trigger_that_wakes_the_service_from_zero() -> None:
    scaled = named(children(ROUTED))["ScaledObject", "svc"]["spec"]
    assert scaled["minReplicaCount"] == 0
    load, pending = scaled["triggers"]
    assert "radixserve_num_queued_requests" in load["metadata"]["query"]
    assert pending["name"] == "router-pending"
    assert pending["metadata"]["query"] == (
        'sum(radixserve_router_pending_requests{namespace="models",'
        'pod=~"svc-router-[a-z0-9]+-[a-z0-9]+"})'
    )
    # Active when the value is above the threshold: one held request wakes the service.
    assert 0 <= float(pending["metadata"]["activationThreshold"]) < 1
    assert pending["metadata"]["threshold"] == load["metadata"]["threshold"] == "4"
    no_router = {**ROUTED, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}, "router": {}}
    assert len(named(children(no_router))["ScaledObject", "svc"]["spec"]["triggers"]) == 1


def test_scaling_to_zero_without_the_router_is_refused_with_the_reason() -> None:
    spec = {"model": MODEL, "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}
    document = defaulted({"spec": spec})
    assert schema_errors(document) == []
    assert cel_violations(document) == [SCALE_TO_ZERO_NEEDS_ROUTER]
    with pytest.raises(InvalidSpecError, match="needs router.enabled"):
        parse_spec(spec, name="svc", default_image="i")
    for allowed in (
        {**spec, "router": {"enabled": True}},
        {**spec, "autoscaling": {"maxReplicas": 2}},  # minReplicas defaults to 1
        {"model": MODEL, "replicas": 0},  # a fixed size of 0 is the user's own choice
    ):
        assert cel_violations(defaulted({"spec": allowed})) == []
        parse_spec(allowed, name="svc", default_image="i")


@pytest.mark.parametrize(
    "router",
    [{"policy": "random"}, {"replicas": 0}, {"pendingTimeoutSeconds": 0}, {"enabled": "yes"}],
)
def test_the_crd_and_parse_spec_refuse_bad_router_fields(router: dict) -> None:
    spec = {"model": MODEL, "router": router}
    assert schema_errors(defaulted({"spec": spec})) != []
    if router != {"enabled": "yes"}:  # a truthy string: the API server refuses it first
        with pytest.raises(InvalidSpecError):
            parse_spec(spec, name="svc", default_image="i")


def test_the_inference_pool_satisfies_the_upstream_v1_crd_and_its_checks_bite() -> None:
    pool = named(children(ROUTED))["InferencePool", "svc"]
    assert inference_pool_problems(pool) == []
    assert pool["spec"]["endpointPickerRef"] == {
        "name": "svc-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    broken = copy.deepcopy(pool)
    del broken["spec"]["endpointPickerRef"]["port"]  # a Service reference needs its port
    assert any("port is required" in p for p in inference_pool_problems(broken))
    broken = copy.deepcopy(pool)
    broken["spec"]["targetPortNumber"] = 8000  # the v1alpha2 field name
    assert inference_pool_problems(broken)
    broken = copy.deepcopy(pool)
    broken["spec"]["targetPorts"] = [{"number": 70000}]
    assert inference_pool_problems(broken)


def test_builtin_router_kinds_validate_strictly() -> None:
    for manifest in children(ROUTED):
        if manifest["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            kubernetes_validate.validate(manifest, "1.30.0", strict=True)


# ---------------------------------------------------------------------------- reconcile


def ready(body: dict[str, Any], replicas: int) -> None:
    body["metadata"]["generation"] = 1
    body["status"] = {
        "observedGeneration": 1,
        "replicas": replicas,
        "readyReplicas": replicas,
        "updatedReplicas": replicas,
    }


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_reconcile_applies_the_router_and_reports_its_readiness() -> None:
    api = MemoryApi()
    spec = {**ROUTED, "router": {"enabled": True}}
    outcome = reconcile(context(api), service(spec), "t0")
    assert ("Deployment", "ns", "svc-router") in api.objects
    assert ("Service", "ns", "svc-workers") in api.objects
    assert conditions(outcome.status)["RouterReady"] == ("False", "RouterNotReady")
    assert conditions(outcome.status)["Ready"] == ("False", "RouterNotReady")
    assert outcome.status["router"] == {"replicas": 0, "readyReplicas": 0}

    router = api.objects["Deployment", "ns", "svc-router"]
    ready(router, 1)
    api.objects["Deployment", "ns", "svc"]["spec"]["replicas"] = 0  # KEDA scaled it to zero
    ready(api.objects["Deployment", "ns", "svc"], 0)
    parent = service(spec, status=outcome.status)
    api.objects["InferenceService", "ns", "svc"] = parent
    refreshed = refresh_status(context(api), router, "t1")
    assert refreshed is not None
    status = refreshed[1].status
    assert conditions(status)["RouterReady"] == ("True", "RouterReady")
    assert conditions(status)["Ready"] == ("True", "ScaledToZero")
    assert status["router"] == {"replicas": 1, "readyReplicas": 1}


def test_disabling_the_router_prunes_it_and_points_the_service_at_the_workers() -> None:
    api = MemoryApi()
    reconcile(context(api), service(ROUTED), "t0")
    assert ("InferencePool", "ns", "svc") in api.objects
    plain = {"model": MODEL, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}
    outcome = reconcile(context(api), service(plain, generation=2), "t1")
    for _, kind, name in router_child_keys(OWNER):
        assert (kind, "ns", name) not in api.objects, (kind, name)
    assert ("InferencePool", "ns", "svc") not in api.objects
    front = api.objects["Service", "ns", "svc"]["spec"]["selector"]
    assert front == selector_labels(OWNER) and front != router_selector_labels(OWNER)
    assert "RouterReady" not in conditions(outcome.status) and "router" not in outcome.status


def test_a_cluster_without_the_inference_pool_crd_is_degraded_but_routed() -> None:
    api = MemoryApi(missing_kinds=("InferencePool",))
    outcome = reconcile(context(api), service(ROUTED), "t0")
    assert conditions(outcome.status)["Degraded"] == ("True", "InferencePoolUnavailable")
    assert ("Deployment", "ns", "svc-router") in api.objects
    assert not outcome.retry


def test_a_late_event_with_an_older_router_copy_does_not_undo_the_status() -> None:
    """Deployment events wait for the status lock in turn: the later handler may hold an older
    copy of the router than the one already reported. The status follows the API, not the copy."""
    api = MemoryApi()
    spec = {**ROUTED, "router": {"enabled": True}}
    outcome = reconcile(context(api), service(spec), "t0")
    router = api.objects["Deployment", "ns", "svc-router"]
    stale = copy.deepcopy(router)
    ready(router, 2)
    api.objects["InferenceService", "ns", "svc"] = service(spec, status=outcome.status)
    refreshed = refresh_status(context(api), stale, "t1")
    assert refreshed is not None
    assert refreshed[1].status["router"] == {"replicas": 2, "readyReplicas": 2}
    assert conditions(refreshed[1].status)["RouterReady"] == ("True", "RouterReady")


def test_a_refused_edit_keeps_reporting_the_router_that_still_runs() -> None:
    """An invalid spec changes no child: the router of the last valid spec still serves, and
    the status says so (else RouterReady would vanish and come back with the next event)."""
    api = MemoryApi()
    spec = {**ROUTED, "router": {"enabled": True}}
    outcome = reconcile(context(api), service(spec), "t0")
    ready(api.objects["Deployment", "ns", "svc-router"], 2)
    refused = {**spec, "autoscaling": {"minReplicas": 3, "maxReplicas": 1}}
    outcome = reconcile(context(api), service(refused, status=outcome.status, generation=2), "t1")
    assert conditions(outcome.status)["Degraded"] == ("True", "InvalidSpec")
    assert conditions(outcome.status)["RouterReady"] == ("True", "RouterReady")
    assert outcome.status["router"] == {"replicas": 2, "readyReplicas": 2}
