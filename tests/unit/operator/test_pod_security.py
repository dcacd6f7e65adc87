"""Worker pods meet the `restricted` Pod Security Standard, for every example and any valid spec.

The check (`pod_security.restricted_violations`) is written from the standard's published
controls; the known-bad pods below show that it refuses what the standard refuses.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from crd_strategies import accepted, specs
from hypothesis import HealthCheck, assume, given, settings
from operator_crd_checks import EXAMPLES
from pod_security import restricted_violations

from radixserve_operator.manifests import Owner, build_children
from radixserve_operator.manifests.workload import CACHE_ENV, MODEL_CACHE_MOUNT
from radixserve_operator.spec import InvalidSpecError, parse_spec

OWNER = Owner(name="svc", namespace="models", uid="0b7c1f0e-5d4a-4c1e-9d3f-2a6b8c9d0e1f")


def worker_pod(spec: dict[str, Any]) -> dict[str, Any]:
    parsed = parse_spec(spec, name=OWNER.name, default_image="registry.example/radixserve:1")
    children = build_children(OWNER, parsed, prometheus_address="http://prometheus:9090")
    (deployment,) = [
        c for c in children if c["kind"] == "Deployment" and c["metadata"]["name"] == OWNER.name
    ]
    kubernetes_validate.validate(deployment, "1.30.0", strict=True)
    return deployment["spec"]["template"]


def assert_restricted_and_writable(template: dict[str, Any], spec: dict[str, Any]) -> None:
    assert restricted_violations(template["spec"], template["metadata"].get("annotations")) == []
    pod = template["spec"]
    (container,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert not mounts["/tmp"]["readOnly"] and not mounts[MODEL_CACHE_MOUNT]["readOnly"]
    # Every cache the operator points somewhere is on a writable volume; a name the user set
    # is the user's (the operator adds no second entry).
    env = container["env"]
    names = [e["name"] for e in env]
    user_names = [e["name"] for e in spec.get("env") or []]
    for name, path in CACHE_ENV.items():
        assert names.count(name) == max(user_names.count(name), 1)
        if name not in user_names:
            assert {"name": name, "value": path} in env
            assert any(path.startswith(m) for m in mounts if not mounts[m]["readOnly"]), name


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e["metadata"]["name"])
def test_example_worker_pods_are_restricted(example: dict[str, Any]) -> None:
    template = worker_pod(example["spec"])
    assert_restricted_and_writable(template, example["spec"])


def test_kernel_caches_share_the_model_cache_claim() -> None:
    spec = {"model": {"uri": "hf://org/m"}, "modelCache": {"claimName": "hf-cache"}}
    pod = worker_pod(spec)["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["TRITON_CACHE_DIR"].startswith(MODEL_CACHE_MOUNT + "/")
    assert env["FLASHINFER_WORKSPACE_BASE"].startswith(MODEL_CACHE_MOUNT + "/")
    assert env["HF_HOME"] == MODEL_CACHE_MOUNT and env["HF_HUB_OFFLINE"] == "0"
    # The image's user owns what the pod writes on the claim.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"] == 10001
    # Without a claim the caches still have a writable home, for the pod's lifetime.
    pod = worker_pod({"model": {"uri": "builtin:smollm2-135m"}})["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"] == {"name": "model-cache", "emptyDir": {}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs)
def test_any_valid_spec_yields_a_restricted_worker_pod(spec: dict[str, Any]) -> None:
    assume(accepted(spec))
    try:
        template = worker_pod(spec)
    except InvalidSpecError:
        assume(False)  # refused specs build no pods (the service turns Degraded)
    assert_restricted_and_writable(template, spec)


GOOD = worker_pod({"model": {"uri": "builtin:smollm2-135m"}})


def _parent(pod: dict[str, Any], path: str) -> tuple[Any, Any]:
    """The node holding the dotted path's last key (numbers index lists), and that key."""
    *parents, last = path.split(".")
    node: Any = pod
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    return node, int(last) if isinstance(node, list) else last


def _set(path: str, value: Any):
    def mutate(pod: dict[str, Any]) -> None:
        node, key = _parent(pod, path)
        node[key] = value

    return mutate


def _drop(path: str):
    def mutate(pod: dict[str, Any]) -> None:
        node, key = _parent(pod, path)
        del node[key]

    return mutate


C = "spec.containers.0.securityContext"
BAD_PODS = {
    "host network": (_set("spec.hostNetwork", True), "Host Namespaces"),
    "host PID": (_set("spec.hostPID", True), "Host Namespaces"),
    "privileged": (_set(f"{C}.privileged", True), "Privileged"),
    "SYS_ADMIN": (_set(f"{C}.capabilities.add", ["SYS_ADMIN"]), "Capabilities"),
    "CHOWN added": (_set(f"{C}.capabilities.add", ["CHOWN"]), "Capabilities"),
    "no drop ALL": (_set(f"{C}.capabilities.drop", ["NET_RAW"]), "drop ALL"),
    "hostPath": (  # also outside the restricted volume types
        _set("spec.volumes.0", {"name": "tmp", "hostPath": {"path": "/tmp"}}),
        "HostPath",
    ),
    "host port": (_set("spec.containers.0.ports.0.hostPort", 8000), "Host Ports"),
    "AppArmor unconfined": (
        _set(f"{C}.appArmorProfile", {"type": "Unconfined"}),
        "AppArmor",
    ),
    "AppArmor annotation": (
        _set("metadata.annotations", {"container.apparmor.security.beta.kubernetes.io/w": "x"}),
        "AppArmor",
    ),
    "SELinux type": (_set(f"{C}.seLinuxOptions", {"type": "spc_t"}), "SELinux"),
    "SELinux user": (_set("spec.securityContext.seLinuxOptions", {"user": "root"}), "SELinux"),
    "proc mount": (_set(f"{C}.procMount", "Unmasked"), "/proc"),
    "seccomp unconfined": (_set(f"{C}.seccompProfile", {"type": "Unconfined"}), "Seccomp"),
    "no seccomp": (_drop("spec.securityContext.seccompProfile"), "Seccomp"),
    "unsafe sysctl": (
        _set("spec.securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]),
        "Sysctls",
    ),
    "nfs volume": (
        _set("spec.volumes.0", {"name": "tmp", "nfs": {"server": "s", "path": "/"}}),
        "Volume Types",
    ),
    "escalation allowed": (_drop(f"{C}.allowPrivilegeEscalation"), "Privilege Escalation"),
    "may run as root": (_drop("spec.securityContext.runAsNonRoot"), "Non-root"),
    "uid 0": (_set(f"{C}.runAsUser", 0), "Non-root user"),
    "gid 0": (_set("spec.securityContext.fsGroup", 0), "groups"),
    "supplemental 0": (_set("spec.securityContext.supplementalGroups", [0]), "groups"),
    "windows host process": (
        _set(f"{C}.windowsOptions", {"hostProcess": True}),
        "HostProcess",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_PODS))
def test_the_check_refuses_each_violation(case: str) -> None:
    mutate, control = BAD_PODS[case]
    pod = copy.deepcopy(GOOD)
    mutate(pod)
    violations = restricted_violations(pod["spec"], pod["metadata"].get("annotations"))
    assert any(control in v for v in violations), violations


def test_the_check_refuses_a_default_pod() -> None:
    """A pod with no security settings at all (what the operator generated before)."""
    pod = {"containers": [{"name": "worker", "image": "i"}]}
    controls = {v.split(":")[0] for v in restricted_violations(pod)}
    assert controls == {"Privilege Escalation", "Running as Non-root", "Seccomp", "Capabilities"}
