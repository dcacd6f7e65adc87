"""The Kubernetes walkthroughs of README.md and docs/operations.md, checked without a cluster.

No kind, Docker engine or cluster runs here, so each command is checked against what it names:
`docker build` a stage and build arguments of the Dockerfile, `kind load` exactly the images
built, `helm install` only values that charts/radixserve/values.yaml has; the chart renders with
those values (helm_python, no helm binary) to an operator running the built image and handing
the built worker image to its services; `rollout status` names the Deployment the chart renders;
`kubectl apply -f` a file whose InferenceServices satisfy the CRD's schema and the operator's
spec parser; the service and model names of the later commands are the applied ones.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml

from radixserve_operator.spec import parse_spec

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "radixserve"
DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()
STAGES = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", DOCKERFILE, flags=re.MULTILINE | re.I))
BUILD_ARGS = set(re.findall(r"^ARG\s+([A-Za-z_]+)", DOCKERFILE, flags=re.MULTILINE))
SEPARATORS = {"&&", "&", ";", "|", "||"}


def section(path: str, heading: str) -> str:
    text = (REPO_ROOT / path).read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def commands(text: str) -> list[list[str]]:
    """Every command of the ```bash blocks in `text`: continuation lines joined, comments
    dropped, `&&`, `&`, `;` and pipes splitting commands."""
    found: list[list[str]] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            command: list[str] = []
            for token in shlex.split(line, comments=True):
                if token in SEPARATORS:
                    found += [command] if command else []
                    command = []
                else:
                    command.append(token)
            found += [command] if command else []
    return found


def options(argv: list[str], names: set[str]) -> list[tuple[str, str]]:
    """(option, value) for each of `names` in argv, `--opt value` or `--opt=value`."""
    pairs = []
    for i, token in enumerate(argv):
        name, eq, value = token.partition("=")
        if name in names:
            pairs.append((name, value if eq else argv[i + 1]))
    return pairs


def helm_set(pairs: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for pair in pairs:
        key, _, text = pair.partition("=")
        value: Any = {"true": True, "false": False}.get(text, text)
        *parents, leaf = key.split(".")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return values


def assert_values_exist(keys: list[str]) -> None:
    """Each key is in values.yaml, or is an entry of a map values.yaml leaves open (labels: {})."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in keys:
        node: Any = defaults
        *parents, leaf = key.split(".")
        for part in parents:
            assert isinstance(node, dict) and part in node, f"--set {key}: no {part} in values.yaml"
            node = node[part]
        assert isinstance(node, dict), f"--set {key}: {'.'.join(parents)} is not a map"
        assert leaf in node or node == {}, f"--set {key}: not in charts/radixserve/values.yaml"


def render(values: dict[str, Any], name: str, namespace: str) -> list[dict]:
    helm_python.disable_logging()
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=name, namespace=namespace, is_install=True)
    return [
        doc
        for path, text in manifests.items()
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def check_inference_services(path: str) -> dict[str, str]:
    """The file's InferenceServices satisfy the CRD's schema: their names and model names."""
    crd = yaml.safe_load((REPO_ROOT / "crds" / "radixserve.io_inferenceservices.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    services = {}
    for doc in yaml.safe_load_all((REPO_ROOT / path).read_text()):
        if not doc or doc.get("kind") != "InferenceService":
            continue
        assert doc["apiVersion"] == f"{crd['spec']['group']}/{version['name']}"
        jsonschema.Draft4Validator(schema).validate(doc)
        name = doc["metadata"]["name"]
        parsed = parse_spec(doc["spec"], name=name, default_image="radixserve-worker:dev")
        services[name] = parsed.model.served_name
    assert services, f"{path} holds no InferenceService"
    return services


def check_walkthrough(cmds: list[list[str]]) -> None:
    built: dict[str, str] = {}  # tag -> stage
    for argv in cmds:
        if argv[:2] == ["docker", "build"]:
            (stage,) = [v for _, v in options(argv, {"--target"})]
            (tag,) = [v for _, v in options(argv, {"-t", "--tag"})]
            assert stage in STAGES, f"no stage {stage} in the Dockerfile"
            for _, arg in options(argv, {"--build-arg"}):
                assert arg.split("=")[0] in BUILD_ARGS, f"the Dockerfile has no ARG {arg}"
            assert argv[-1] == ".", argv
            built[tag] = stage
    loads = [argv for argv in cmds if argv[:3] == ["kind", "load", "docker-image"]]
    for argv in loads:
        images = [
            t
            for i, t in enumerate(argv[3:], 3)
            if not t.startswith("-") and argv[i - 1] != "--name"
        ]
        assert set(images) == set(built), "kind load loads exactly the images built"

    installs = [argv for argv in cmds if argv[:2] == ["helm", "install"]]
    assert installs, "no helm install"
    applied: dict[str, str] = {}
    for argv in cmds:
        if argv[:2] == ["kubectl", "apply"]:
            for _, path in options(argv, {"-f", "--filename"}):
                applied |= check_inference_services(path)
    for argv in installs:
        name, chart = argv[2], argv[3]
        assert (REPO_ROOT / chart).resolve() == CHART
        (namespace,) = [v for _, v in options(argv, {"--namespace", "-n"})]
        sets = [v for _, v in options(argv, {"--set"})]
        assert_values_exist([s.partition("=")[0] for s in sets])
        objects = render(helm_set(sets), name, namespace)
        (operator,) = [o for o in objects if o["kind"] == "Deployment"]
        (container,) = operator["spec"]["template"]["spec"]["containers"]
        (worker_image,) = [
            a.removeprefix("--worker-image=") for a in container["args"] if "--worker-image=" in a
        ]
        if built:  # the images this walkthrough built are the ones the chart runs
            assert built.get(container["image"]) == "operator", container["image"]
            assert built.get(worker_image) == "worker", worker_image
        for argv2 in cmds:
            if argv2[:3] == ["kubectl", "-n", namespace] and argv2[3:5] == ["rollout", "status"]:
                assert argv2[5] == f"deployment/{operator['metadata']['name']}"
    for argv in cmds:
        if argv[:1] != ["kubectl"] or options(argv, {"-n", "--namespace"}):
            continue  # the examples are applied to the current namespace; others hold other things
        for token in argv:
            kind, _, name = token.partition("/")
            if kind in {"inferenceservice", "service"} and name:
                assert name in applied, f"{token}: not a service the walkthrough applied"
        if argv[1:2] == ["get"] and argv[2:3] == ["inferenceservice"] and len(argv) > 3:
            assert argv[3] in applied
    for argv in cmds:
        if argv[:1] == ["curl"]:
            (body,) = [v for _, v in options(argv, {"-d", "--data"})]
            assert json.loads(body)["model"] in applied.values()


@pytest.mark.parametrize(
    ("path", "heading"),
    [
        ("docs/operations.md", "A local cluster with kind"),
        ("docs/operations.md", "Quick start"),
        ("README.md", "On Kubernetes"),
    ],
)
def test_walkthrough_commands_name_what_exists(path: str, heading: str) -> None:
    cmds = commands(section(path, heading))
    assert cmds, f"no commands under {heading!r} in {path}"
    check_walkthrough(cmds)


def test_the_kind_walkthrough_builds_loads_and_points_the_chart_at_both_images() -> None:
    cmds = commands(section("docs/operations.md", "A local cluster with kind"))
    firsts = [" ".join(argv[:3]) for argv in cmds]
    order = [
        "kind create cluster",
        "docker build --target",
        "kind load docker-image",
        "helm install radixserve",
        "kubectl apply -f",
        "kind delete cluster",
    ]
    positions = [next(i for i, f in enumerate(firsts) if f.startswith(step)) for step in order]
    assert positions == sorted(positions), firsts
    stages = {
        v
        for argv in cmds
        if argv[:2] == ["docker", "build"]
        for _, v in options(argv, {"--target"})
    }
    assert stages == STAGES == {"operator", "worker"}


def test_the_prerequisites_name_what_the_chart_and_crd_need() -> None:
    """Kubernetes 1.30 (the CRD's optionalOldSelf CEL rule), the `release` label the chart's
    ServiceMonitor carries from its values, KEDA and the InferencePool CRDs."""
    readme = section("README.md", "On Kubernetes")
    crd = (REPO_ROOT / "crds" / "radixserve.io_inferenceservices.yaml").read_text()
    assert "optionalOldSelf" in crd and "1.30" in readme
    assert "serviceMonitor.labels.release" in readme and "release: <its release name>" in readme
    (monitor,) = [
        o
        for o in render(
            {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}, "rs", "ns"
        )
        if o["kind"] == "ServiceMonitor"
    ]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    for needed in ("KEDA", "inference.networking.k8s.io", "not published", "docs/operations.md"):
        assert needed in readme or needed.replace("not published", "none are published") in readme
