"""The Helm chart, linted and rendered by Helm itself (helm-python-sdk bundles Helm's Go library).

Rendered manifests are validated against the official Kubernetes OpenAPI schemas
(kubernetes-validate) and the InferenceService against the CRD's own schema.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from radixserve_operator import KIND
from radixserve_operator.kube import PLURALS
from radixserve_operator.manifests.meta import Owner
from radixserve_operator.manifests.router import ENDPOINT_SLICE_RULE, build_workers_service
from radixserve_operator.manifests.service import build_service
from radixserve_operator.spec import parse_spec

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "radixserve"
KUBERNETES_VERSION = "1.30.0"
EVERYTHING_ON = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True},
    "dashboards": {"enabled": True},
    "inferenceService": {"enabled": True},
}
# (apiGroup, resource) -> verbs: every permission the operator holds, and no other. Derived
# from operator/radixserve_operator (kube.py: server-side apply, get, delete, status patch, the
# Secret of the workers' key read by name; handlers.py: the kopf watches, the worker pods
# listed per service) and kopf's own needs
# (events, peering, CRD observation).
APPLIED = {"get", "create", "patch", "delete"}
WORKLOAD_PERMISSIONS = {
    ("radixserve.io", "inferenceservices"): {"get", "list", "watch", "patch"},
    ("radixserve.io", "inferenceservices/status"): {"patch"},
    ("apps", "deployments"): APPLIED | {"list", "watch"},
    ("", "services"): APPLIED,
    ("", "pods"): {"list", "watch"},
    ("policy", "poddisruptionbudgets"): APPLIED,
    ("keda.sh", "scaledobjects"): APPLIED,
    ("monitoring.coreos.com", "servicemonitors"): APPLIED,
    ("", "serviceaccounts"): APPLIED,
    ("", "configmaps"): APPLIED,  # spec.loras (placement all): NAME-loras
    # KubeApi.read_secret (spec.loras' sync): the Secret spec.apiKeySecretRef names, by name
    ("", "secrets"): {"get"},
    ("rbac.authorization.k8s.io", "roles"): APPLIED,
    ("rbac.authorization.k8s.io", "rolebindings"): APPLIED,
    # not used by the operator itself: it may grant a router only what it holds (RBAC escalation)
    ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch"},
    ("inference.networking.k8s.io", "inferencepools"): APPLIED,
    ("", "events"): {"create"},
}


def render(values: dict[str, Any] | None = None, namespace: str = "radixserve") -> list[dict]:
    """Every object the chart renders with `values`, NOTES.txt excluded."""
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name="rs", namespace=namespace, is_install=True)
    objects = []
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def notes(values: dict[str, Any] | None = None) -> str:
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name="rs", namespace="radixserve", is_install=True)
    return manifests["radixserve/templates/NOTES.txt"]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def permissions(role: dict) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


@pytest.fixture(scope="module", autouse=True)
def quiet_helm() -> None:
    helm_python.disable_logging()


def test_helm_lint_is_clean_in_strict_mode() -> None:
    for values in (None, EVERYTHING_ON):
        report = helm_python.lint(CHART, values, strict=True)
        assert report["errors"] == []
        # Severity 1 is INFO (only "icon is recommended"); 2 WARNING and 4 ERROR must not occur.
        assert all(m["severity"] <= 1 for m in report["messages"]), report["messages"]


def test_values_yaml_satisfies_values_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


@pytest.mark.parametrize(
    "bad_values",
    [
        {"operator": {"verbose": "yes"}},
        {"operator": {"logLevel": "debug"}},
        {"serviceMonitor": {"enabled": "yes"}},
        {"dashboards": {"enabeld": True}},
        {"operator": {"watchNamespaces": ["Not_A_Namespace"]}},
        {"inferenceService": {"enabled": True, "spec": {"model": {"uri": ""}}}},
    ],
)
def test_values_schema_rejects_bad_values_at_render_time(bad_values: dict) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render(bad_values)


@pytest.mark.parametrize("values", [None, EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_rendered_builtin_kinds_match_official_kubernetes_schemas(values: dict | None) -> None:
    objects = render(values)
    builtin = [
        o
        for o in objects
        if o["apiVersion"].split("/")[0] in {"v1", "apps", "rbac.authorization.k8s.io"}
    ]
    assert {o["kind"] for o in builtin} >= {
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    for obj in builtin:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_defaults_render_only_the_operator_and_its_rbac() -> None:
    kinds = sorted(o["kind"] for o in render())
    assert kinds == sorted(
        ["Deployment", "ServiceAccount", "ClusterRole", "ClusterRole"]
        + ["ClusterRoleBinding", "ClusterRoleBinding", "ClusterKopfPeering"]
    )


def test_chart_crds_are_the_repository_crds() -> None:
    with helm_python.Chart.load(CHART) as chart:
        shipped = {Path(crd["name"]).name: crd["data"] for crd in chart.crds}
    source = {path.name: path.read_text() for path in (REPO_ROOT / "crds").glob("*.yaml")}
    assert "radixserve.io_inferenceservices.yaml" in shipped
    assert shipped == source


def test_operator_runs_non_root_and_read_only_and_watches_all_namespaces() -> None:
    (deployment,) = by_kind(render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["image"] == "ghcr.io/radixserve/radixserve-operator:0.1.0"
    assert "--all-namespaces" in container["args"]
    assert "--peering=rs-radixserve-operator" in container["args"]
    assert "--worker-image=ghcr.io/radixserve/radixserve:0.1.0" in container["args"]
    assert container["livenessProbe"]["httpGet"]["port"] == "health"


def test_cluster_wide_rbac_is_least_privilege() -> None:
    objects = render()
    roles = {r["metadata"]["name"]: r for r in by_kind(objects, "ClusterRole")}
    assert permissions(roles["rs-radixserve-operator-cluster"]) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch"},
    }
    assert permissions(roles["rs-radixserve-operator-workloads"]) == WORKLOAD_PERMISSIONS
    bindings = {b["roleRef"]["name"] for b in by_kind(objects, "ClusterRoleBinding")}
    assert bindings == set(roles)
    assert by_kind(objects, "RoleBinding") == []


def test_namespaced_mode_binds_workload_permissions_per_namespace_only() -> None:
    objects = render({"operator": {"watchNamespaces": ["team-a", "team-b"]}})
    (deployment,) = by_kind(objects, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--namespace=team-a", "--namespace=team-b"} <= set(args)
    assert "--all-namespaces" not in args
    peerings = by_kind(objects, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert by_kind(objects, "ClusterKopfPeering") == []
    role_bindings = by_kind(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in role_bindings) == ["team-a", "team-b"]
    assert {b["roleRef"]["name"] for b in role_bindings} == {"rs-radixserve-operator-workloads"}
    cluster_bindings = {b["roleRef"]["name"] for b in by_kind(objects, "ClusterRoleBinding")}
    assert cluster_bindings == {"rs-radixserve-operator-cluster"}
    roles = {r["metadata"]["name"]: r for r in by_kind(objects, "ClusterRole")}
    workloads = permissions(roles["rs-radixserve-operator-workloads"])
    assert workloads[("kopf.dev", "kopfpeerings")] == {"get", "list", "watch", "patch"}
    assert ("kopf.dev", "clusterkopfpeerings") not in permissions(
        roles["rs-radixserve-operator-cluster"]
    )


def test_prometheus_rule_carries_exactly_the_promtool_tested_rules() -> None:
    (rule,) = by_kind(render(EVERYTHING_ON), "PrometheusRule")
    expected = []
    for name in ("recording-rules.yaml", "alert-rules.yaml"):
        expected += yaml.safe_load((REPO_ROOT / "prometheus" / name).read_text())["groups"]
    assert rule["spec"]["groups"] == expected


def test_dashboard_configmaps_carry_every_dashboard_for_the_grafana_sidecar() -> None:
    config_maps = by_kind(render(EVERYTHING_ON), "ConfigMap")
    shipped = {}
    for config_map in config_maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped.update(config_map["data"])
    source = {p.name: json.loads(p.read_text()) for p in (REPO_ROOT / "dashboards").glob("*.json")}
    assert {name: json.loads(text) for name, text in shipped.items()} == source
    for config_map in config_maps:
        kubernetes_validate.validate(config_map, KUBERNETES_VERSION, strict=True)


def test_service_monitor_selects_worker_services_on_their_http_port() -> None:
    (monitor,) = by_kind(render(EVERYTHING_ON), "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchExpressions"] == [
        {"key": "app.kubernetes.io/component", "operator": "In", "values": ["worker", "router"]}
    ]
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {
        "port": "http",
        "path": "/metrics",
        "interval": "15s",
        "scrapeTimeout": "10s",
    }


def test_inference_service_from_values_satisfies_the_crd_schema() -> None:
    (service,) = by_kind(render(EVERYTHING_ON), "InferenceService")
    crd = yaml.safe_load((REPO_ROOT / "crds" / "radixserve.io_inferenceservices.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    assert service["apiVersion"] == f"{crd['spec']['group']}/{version['name']}"
    jsonschema.Draft4Validator(version["schema"]["openAPIV3Schema"]).validate(service)
    assert service["spec"]["model"]["uri"] == "builtin:smollm2-135m"
    parsed = parse_spec(service["spec"], name="smollm2", default_image="radixserve:test")
    assert parsed.model.served_name == "smollm2" and parsed.resources.gpu == 0


def test_notes_tell_the_user_what_to_do_next() -> None:
    text = notes()
    assert "kubectl apply -f examples/service.yaml" in text
    assert "kubectl port-forward" in text and "/v1/chat/completions" in text
    assert "docs/operations.md" in text
    assert "dashboards.enabled=true" in text
    assert '"model": "smollm2"' in text
    custom = {
        "inferenceService": {"enabled": True, "name": "llama", "spec": {"model": {"name": "l3"}}}
    }
    assert '"model": "l3"' in notes(custom)
    assert "Grafana's sidecar loads" in notes(EVERYTHING_ON)


def test_an_api_key_secret_reaches_the_service_and_the_notes() -> None:
    keyed = {
        "inferenceService": {
            "enabled": True,
            "spec": {
                "model": {"uri": "builtin:smollm2-135m"},
                "apiKeySecretRef": {"name": "smollm2-api-key", "key": "key"},
            },
        }
    }
    (service,) = by_kind(render(keyed), "InferenceService")
    assert service["spec"]["apiKeySecretRef"] == {"name": "smollm2-api-key", "key": "key"}
    parsed = parse_spec(service["spec"], name="smollm2", default_image="radixserve:test")
    assert parsed.api_key_secret is not None and parsed.api_key_secret.name == "smollm2-api-key"
    text = notes(keyed)
    assert "get secret smollm2-api-key -o jsonpath='{.data.key}'" in text
    assert "Authorization: Bearer $KEY" in text
    assert "spec.apiKeySecretRef" in notes()


def test_rbac_covers_every_kind_the_operator_applies() -> None:
    for (api_version, kind), plural in PLURALS.items():
        group = api_version.rpartition("/")[0]
        verbs = WORKLOAD_PERMISSIONS[(group, plural)]
        needed = {"get", "patch"} if kind == KIND else APPLIED
        assert needed <= verbs, (kind, needed - verbs)


def test_packaged_chart_is_self_contained_and_renders_the_same(tmp_path: Path) -> None:
    """`helm package` resolves the crds/, dashboards/ and rules/ symlinks into real files."""
    archive = helm_python.package(CHART, destination=tmp_path)
    with tarfile.open(archive) as tar:
        members = {Path(name).relative_to("radixserve").as_posix() for name in tar.getnames()}
    assert {"crds/radixserve.io_inferenceservices.yaml", "rules/alert-rules.yaml"} <= members
    assert {f"dashboards/{p.name}" for p in (REPO_ROOT / "dashboards").glob("*.json")} <= members
    assert not [m for m in members if m.endswith(".py") or m.startswith("rules/tests")]
    with helm_python.Chart.load(archive) as chart:
        packaged = chart.render(EVERYTHING_ON, name="rs", namespace="radixserve")
    with helm_python.Chart.load(CHART) as chart:
        assert packaged == chart.render(EVERYTHING_ON, name="rs", namespace="radixserve")


@pytest.mark.parametrize("router", [False, True], ids=["workers", "router"])
def test_service_monitor_matches_the_services_the_operator_builds(router: bool) -> None:
    owner = Owner(name="smollm2", namespace="team-a", uid="0")
    services = [build_service(owner, router=router)]
    if router:
        services.append(build_workers_service(owner))
    (monitor,) = by_kind(render(EVERYTHING_ON), "ServiceMonitor")
    selector = monitor["spec"]["selector"]
    for service in services:
        labels = service["metadata"]["labels"]
        assert selector["matchLabels"].items() <= labels.items()
        for expression in selector["matchExpressions"]:
            assert labels[expression["key"]] in expression["values"]
        port_names = {port["name"] for port in service["spec"]["ports"]}
        assert {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]} <= port_names


def test_the_operator_holds_every_permission_it_grants_a_router() -> None:
    """Kubernetes refuses a Role that grants more than its creator holds (no `escalate`)."""
    (workloads,) = [
        r for r in by_kind(render(), "ClusterRole") if r["metadata"]["name"].endswith("-workloads")
    ]
    held = permissions(workloads)
    for group in ENDPOINT_SLICE_RULE["apiGroups"]:
        for resource in ENDPOINT_SLICE_RULE["resources"]:
            assert set(ENDPOINT_SLICE_RULE["verbs"]) <= held[(group, resource)]
