"""Builders: every manifest validates against the Kubernetes schemas, for examples and a spread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from operator_crd_checks import cel_violations, defaulted, inference_pool_problems, schema_errors

from radixserve_operator.manifests import Owner, build_children, worker_args
from radixserve_operator.manifests.scaled_object import prometheus_query
from radixserve_operator.spec import API_KEY_ENV, InvalidSpecError, parse_spec

REPO = Path(__file__).resolve().parents[3]
OWNER = Owner(name="svc", namespace="models", uid="0b7c1f0e-5d4a-4c1e-9d3f-2a6b8c9d0e1f")
K8S_VERSION = "1.30.0"


def arg_value(args: list[str], flag: str) -> str:
    """The value given to `flag` in a worker command line (`--flag=value`)."""
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    return value


EXAMPLES = {
    path.name: yaml.safe_load(path.read_text())
    for path in sorted((REPO / "examples").glob("*.yaml"))
    if yaml.safe_load(path.read_text()).get("kind") == "InferenceService"
}
# The fields KEDA and the Prometheus Operator require (their CRDs are not Kubernetes schemas).
CUSTOM_KIND_SCHEMAS: dict[str, dict[str, Any]] = {
    "ScaledObject": {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["scaleTargetRef", "triggers"],
                "properties": {
                    "scaleTargetRef": {"type": "object", "required": ["name"]},
                    "minReplicaCount": {"type": "integer", "minimum": 0},
                    "maxReplicaCount": {"type": "integer", "minimum": 1},
                    "triggers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["type", "metadata"],
                            "properties": {
                                "metadata": {
                                    "type": "object",
                                    "additionalProperties": {"type": "string"},
                                }
                            },
                        },
                    },
                },
            }
        },
    },
    "ServiceMonitor": {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "properties": {"endpoints": {"type": "array", "minItems": 1}},
            }
        },
    },
}


def children(spec: dict[str, Any], name: str = OWNER.name) -> list[dict[str, Any]]:
    parsed = parse_spec(spec, name=name, default_image="registry.example/radixserve:1")
    return build_children(OWNER, parsed, prometheus_address="http://prometheus:9090")


def assert_valid(manifest: dict[str, Any]) -> None:
    if manifest["kind"] == "InferencePool":
        assert inference_pool_problems(manifest) == []
    elif manifest["kind"] in CUSTOM_KIND_SCHEMAS:
        jsonschema.validate(manifest, CUSTOM_KIND_SCHEMAS[manifest["kind"]])
    else:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    meta = manifest["metadata"]
    assert meta["ownerReferences"] == [OWNER.reference()]
    assert meta["labels"]["radixserve.io/inferenceservice"] == OWNER.name
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "radixserve-operator"


def by_kind(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {manifest["kind"]: manifest for manifest in manifests}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_children_validate(name: str) -> None:
    manifests = children(EXAMPLES[name]["spec"])
    for manifest in manifests:
        assert_valid(manifest)
    kinds = set(by_kind(manifests))
    assert {"Deployment", "Service", "PodDisruptionBudget"} <= kinds
    if "autoscaling" in EXAMPLES[name]["spec"]:
        assert {"ScaledObject", "ServiceMonitor"} <= kinds


def test_cpu_example_deployment() -> None:
    deployment = by_kind(children(EXAMPLES["service.yaml"]["spec"]))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert arg_value(container["args"], "--device") == "cpu"
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": "25%",
        "maxUnavailable": 0,
    }
    assert {
        probe: container[probe]["httpGet"]["path"]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    } == {
        "startupProbe": "/health",
        "livenessProbe": "/health",
        "readinessProbe": "/ready",
    }
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # the example's timeout
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8000"


def test_gpu_example_is_gpu_safe_and_autoscaled() -> None:
    manifests = by_kind(children(EXAMPLES["gpu-llama.yaml"]["spec"]))
    deployment = manifests["Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # No surge pod waiting for a GPU that does not exist.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert {"name": "HF_HOME", "value": "/models/cache"} in container["env"]
    assert {"name": "HF_HUB_OFFLINE", "value": "0"} in container["env"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == "hf-cache"
    scaled = manifests["ScaledObject"]["spec"]
    assert scaled["scaleTargetRef"] == {
        "apiVersion": "radixserve.io/v1alpha1",
        "kind": "InferenceService",
        "name": OWNER.name,
    }
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (1, 4)
    trigger = scaled["triggers"][0]
    assert trigger["metadata"]["threshold"] == "4"
    assert "radixserve_num_queued_requests" in trigger["metadata"]["query"]


def test_grace_period_covers_prestop_and_drain() -> None:
    spec = {
        "model": {"uri": "builtin:smollm2-135m"},
        "lifecycle": {"preStopSleepSeconds": 7, "drainTimeoutSeconds": 90},
    }
    deployment = by_kind(children(spec))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "7"]
    assert pod["terminationGracePeriodSeconds"] > 7 + 90
    assert arg_value(container["args"], "--drain-timeout") == "90"


def test_tensor_parallel_sets_the_gpu_count() -> None:
    spec = {"model": {"uri": "hf://org/model"}, "engine": {"tensorParallelSize": 4}}
    deployment = by_kind(children(spec))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert arg_value(container["args"], "--tp-size") == "4"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


@pytest.mark.parametrize(
    ("uri", "model_arg", "volume"),
    [
        ("builtin:smollm2-135m", "builtin:smollm2-135m", None),
        ("file:///weights/llama.gguf", "/weights/llama.gguf", None),
        ("pvc://weights/llama-8b", "/models/source/llama-8b", "model-source"),
        ("pvc://weights", "/models/source", "model-source"),
        ("hf://org/repo", "org/repo", None),
    ],
)
def test_model_sources(uri: str, model_arg: str, volume: str | None) -> None:
    """Every pod has scratch space and a model cache (kernels, tokenizer, Hub downloads)."""
    spec = parse_spec({"model": {"uri": uri}}, name="svc", default_image="img")
    args = worker_args(spec)
    assert arg_value(args, "--model") == model_arg
    pod = by_kind(children({"model": {"uri": uri}}))["Deployment"]["spec"]["template"]["spec"]
    names = [v["name"] for v in pod.get("volumes", [])]
    assert names == ["tmp", *([volume] if volume else []), "model-cache"]


def test_the_api_key_comes_from_the_secret_never_as_an_argument() -> None:
    spec = {
        "model": {"uri": "builtin:smollm2-135m"},
        "apiKeySecretRef": {"name": "svc-api-key", "key": "token"},
        "env": [{"name": "LOG_FORMAT", "value": "json"}],
    }
    manifests = children(spec)
    for manifest in manifests:
        assert_valid(manifest)
    container = by_kind(manifests)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert {
        "name": "RADIXSERVE_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "svc-api-key", "key": "token"}},
    } in container["env"]
    assert {"name": "LOG_FORMAT", "value": "json"} in container["env"]
    assert not any("key" in arg for arg in container["args"])
    # probes stay on the open endpoints
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    without = by_kind(children({"model": {"uri": "builtin:smollm2-135m"}}))["Deployment"]
    names = {e["name"] for e in without["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "RADIXSERVE_API_KEY" not in names


def test_the_api_key_variable_is_the_one_the_worker_reads() -> None:
    from radixserve.server_args import API_KEY_ENV as WORKER_API_KEY_ENV

    assert API_KEY_ENV == WORKER_API_KEY_ENV


def test_a_literal_api_key_in_env_is_refused() -> None:
    spec = {
        "model": {"uri": "builtin:smollm2-135m"},
        "env": [{"name": "RADIXSERVE_API_KEY", "value": "in-plain-sight"}],
    }
    with pytest.raises(InvalidSpecError, match="apiKeySecretRef"):
        parse_spec(spec, name="svc", default_image="i")


def test_engine_flags_map_to_worker_cli() -> None:
    spec = {
        "model": {"uri": "builtin:smollm2-135m", "name": "small"},
        "engine": {
            "cudaGraph": False,
            "radixCache": False,
            "overlapSchedule": False,
            "schedulePolicy": "fcfs",
            "maxQueuedRequests": 64,
            "extraArgs": ["--foo", "bar"],
        },
    }
    args = worker_args(parse_spec(spec, name="svc", default_image="img"))
    for flag in ("--disable-cuda-graph", "--disable-radix-cache", "--disable-overlap"):
        assert flag in args
    assert arg_value(args, "--schedule-policy") == "fcfs"
    assert arg_value(args, "--max-queued-requests") == "64"
    assert arg_value(args, "--served-model-name") == "small"
    assert args[-2:] == ["--foo", "bar"]


def test_the_host_kv_tier_is_a_worker_flag() -> None:
    spec = {"model": {"uri": "builtin:smollm2-135m"}, "engine": {"kvHostMemory": 64}}
    args = worker_args(parse_spec(spec, name="svc", default_image="img"))
    assert arg_value(args, "--kv-host-memory") == "64.0"
    plain = worker_args(parse_spec({"model": spec["model"]}, name="svc", default_image="img"))
    assert not any(arg.startswith("--kv-host-memory") for arg in plain)


def test_the_disk_kv_tier_lives_on_the_model_cache_volume() -> None:
    model = {"uri": "builtin:smollm2-135m"}
    spec = {"model": model, "engine": {"kvHostMemory": 64, "kvDiskSize": 200}}
    args = worker_args(parse_spec(spec, name="svc", default_image="img"))
    assert arg_value(args, "--kv-disk-path") == "/models/cache/kv-cache"
    assert arg_value(args, "--kv-disk-size") == "200.0"
    spec["engine"] = {"kvHostMemory": 64}
    args = worker_args(parse_spec(spec, name="svc", default_image="img"))
    assert not any(arg.startswith("--kv-disk") for arg in args)


def test_speculative_decoding_is_worker_flags() -> None:
    model = {"uri": "builtin:smollm2-135m"}
    spec = {"model": model, "engine": {"speculative": {"method": "ngram", "numTokens": 6}}}
    args = worker_args(parse_spec(spec, name="svc", default_image="img"))
    assert arg_value(args, "--speculative-method") == "ngram"
    assert arg_value(args, "--speculative-num-tokens") == "6"
    spec["engine"]["speculative"] = {"method": "ngram"}
    args = worker_args(parse_spec(spec, name="svc", default_image="img"))
    assert not any(arg.startswith("--speculative-num-tokens") for arg in args)
    plain = worker_args(parse_spec({"model": model}, name="svc", default_image="img"))
    assert not any(arg.startswith("--speculative") for arg in plain)
    draft = {"method": "draft", "draftModel": "hf://org/small-draft", "numTokens": 3}
    spec["engine"]["speculative"] = draft
    args = worker_args(parse_spec(spec, name="svc", default_image="img"))
    assert arg_value(args, "--speculative-method") == "draft"
    assert arg_value(args, "--speculative-draft-model") == "org/small-draft"
    spec["engine"]["speculative"] = {"method": "draft", "draftModel": "pvc://claim/draft"}
    with pytest.raises(InvalidSpecError):
        parse_spec(spec, name="svc", default_image="img")


def test_kv_events_reach_the_worker_its_services_and_the_router() -> None:
    events = {"enabled": True, "port": 6001, "replayPort": 6002, "blockSize": 32}
    spec = {"model": {"uri": "builtin:smollm2-135m"}, "engine": {"kvEvents": events}}
    made = {(c["kind"], c["metadata"]["name"]): c for c in children(spec)}
    worker = made[("Deployment", OWNER.name)]["spec"]["template"]["spec"]["containers"][0]
    assert arg_value(worker["args"], "--kv-events-endpoint") == "tcp://*:6001"
    assert arg_value(worker["args"], "--kv-events-replay-endpoint") == "tcp://*:6002"
    assert arg_value(worker["args"], "--kv-events-block-size") == "32"
    assert [(p["name"], p["containerPort"]) for p in worker["ports"]] == [
        ("http", 8000),
        ("kv-events", 6001),
        ("kv-events-replay", 6002),
    ]
    ports = made[("Service", OWNER.name)]["spec"]["ports"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in ports] == [
        ("http", 8000, "http"),
        ("kv-events", 6001, "kv-events"),
        ("kv-events-replay", 6002, "kv-events-replay"),
    ]
    # behind the router: the workers' headless Service carries the ports, the router reads them
    made = {
        (c["kind"], c["metadata"]["name"]): c
        for c in children({**spec, "router": {"enabled": True}})
    }
    assert [p["name"] for p in made[("Service", OWNER.name)]["spec"]["ports"]] == ["http"]
    headless = made[("Service", f"{OWNER.name}-workers")]["spec"]["ports"]
    assert [p["name"] for p in headless] == ["http", "kv-events", "kv-events-replay"]
    router = made[("Deployment", f"{OWNER.name}-router")]["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    assert arg_value(args, "--prefix-source") == "events"
    assert arg_value(args, "--kv-events-port") == "6001"
    assert arg_value(args, "--kv-events-replay-port") == "6002"
    assert arg_value(args, "--kv-events-block-size") == "32"
    for manifest in made.values():
        assert_valid(manifest)


def test_kv_events_off_cost_nothing() -> None:
    spec = {"model": {"uri": "builtin:smollm2-135m"}, "router": {"enabled": True}}
    for manifest in children({**spec, "engine": {"kvEvents": {"enabled": False}}}):
        text = repr(manifest)
        assert "kv-events" not in text and "prefix-source" not in text


def test_query_does_not_match_a_prefixed_neighbour() -> None:
    query = prometheus_query(Owner("svc-a", "ns", "u"), "running")
    assert (
        query
        == 'sum(radixserve_num_running_requests{namespace="ns",pod=~"svc-a-[a-z0-9]+-[a-z0-9]+"})'
    )


quantities = st.sampled_from(["500m", "1", "2", "4Gi", "16Gi"])
valid_specs = st.fixed_dictionaries(
    {
        "model": st.fixed_dictionaries(
            {
                "uri": st.sampled_from(
                    ["builtin:smollm2-135m", "hf://org/m", "pvc://claim/dir", "file:///m.gguf"]
                )
            }
        )
    },
    optional={
        "replicas": st.integers(0, 8),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "gpu": st.integers(0, 8),
                "requests": st.dictionaries(
                    st.sampled_from(["cpu", "memory"]), quantities, max_size=2
                ),
            },
        ),
        "engine": st.fixed_dictionaries(
            {},
            optional={
                "attentionBackend": st.sampled_from(
                    ["auto", "torch_native", "triton", "flashinfer"]
                ),
                "maxRunningRequests": st.integers(1, 512),
                "chunkedPrefillSize": st.integers(1, 8192),
                "memFractionStatic": st.floats(0.05, 0.95),
                "cudaGraph": st.booleans(),
                "kvHostMemory": st.floats(0.5, 512),
                "kvEvents": st.fixed_dictionaries(
                    {"enabled": st.booleans()},
                    optional={"port": st.integers(5000, 5999), "blockSize": st.integers(1, 64)},
                ),
                "speculative": st.fixed_dictionaries(
                    {"method": st.just("ngram")}, optional={"numTokens": st.integers(1, 16)}
                ),
            },
        ),
        "modelCache": st.just({"claimName": "cache"}),
        "nodeSelector": st.dictionaries(
            st.sampled_from(["pool", "zone"]), st.sampled_from(["a", "b"])
        ),
        "runtimeClassName": st.just("nvidia"),
        "apiKeySecretRef": st.fixed_dictionaries(
            {
                "name": st.sampled_from(["keys", "svc.api-key"]),
                "key": st.sampled_from(["k", "api_key"]),
            }
        ),
        "lifecycle": st.fixed_dictionaries(
            {},
            optional={
                "startupTimeoutSeconds": st.integers(10, 7200),
                "preStopSleepSeconds": st.integers(0, 60),
                "drainTimeoutSeconds": st.integers(0, 600),
            },
        ),
        "monitoring": st.fixed_dictionaries({"serviceMonitor": st.booleans()}),
        "router": st.fixed_dictionaries(
            {"enabled": st.booleans()},
            optional={
                "replicas": st.integers(1, 4),
                "policy": st.sampled_from(["cache_aware", "power_of_two", "round_robin"]),
                "inferencePool": st.booleans(),
            },
        ),
    },
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=valid_specs, autoscale=st.booleans())
def test_any_valid_spec_builds_valid_manifests(spec: dict[str, Any], autoscale: bool) -> None:
    if autoscale:
        spec = {k: v for k, v in spec.items() if k != "replicas"}
        # Scaling to zero needs the router (a CEL rule); with it, the floor may be 0.
        floor = 0 if spec.get("router", {}).get("enabled") else 1
        spec["autoscaling"] = {"minReplicas": floor, "maxReplicas": 3, "metric": "kvCacheUsage"}
    document = defaulted({"spec": spec})
    assert schema_errors(document) == [] and cel_violations(document) == []  # valid per the CRD
    manifests = children(spec)
    for manifest in manifests:
        assert_valid(manifest)
    deployment = by_kind(manifests)["Deployment"]  # the workers' (applied last)
    assert deployment["metadata"]["name"] == OWNER.name
    pod = deployment["spec"]["template"]["spec"]
    gpu = spec.get("resources", {}).get("gpu", 0)
    if gpu:
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    lifecycle = parse_spec(spec, name="svc", default_image="i").lifecycle
    assert (
        pod["terminationGracePeriodSeconds"]
        >= lifecycle.pre_stop_sleep_seconds + lifecycle.drain_timeout_seconds
    )
