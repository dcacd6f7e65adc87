"""The README's local example works as written: the model it asks for is the one `make serve`
serves, the knobs and the cache it names are the Makefile's, its links lead somewhere, and the
benchmark `make bench` runs exists and accepts its arguments."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from radixserve.entrypoints.cli import build_parser
from radixserve.server_args import ServerArgs, cache_root

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_local_curl_asks_for_the_model_make_serve_serves() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    local = readme[: readme.index("## On Kubernetes")]
    (body,) = re.findall(r"-d '(\{.*?\})'", local, flags=re.DOTALL)
    request = json.loads(body)
    assert request["model"] == ServerArgs().served_model_name == "smollm2-135m"
    assert request["temperature"] == 0
    makefile = (REPO_ROOT / "Makefile").read_text()
    # no --model: the bundled one; loopback unless HOST says otherwise
    assert "$(BIN)/radixserve serve --host $(HOST) --port $(PORT) $(ARGS)" in makefile
    assert re.search(r"^HOST \?= 127\.0\.0\.1$", makefile, flags=re.MULTILINE)
    assert "http://127.0.0.1:8000" in local


def test_the_readme_names_the_knobs_and_the_cache_of_the_makefile() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    local = readme[: readme.index("## On Kubernetes")]
    makefile = (REPO_ROOT / "Makefile").read_text()
    for knob in ("PORT", "HOST", "ARGS"):
        assert re.search(rf"^{knob} \?=", makefile, flags=re.MULTILINE), knob
        assert f"| `{knob}` |" in local, knob
    assert "CACHE_DIR := $(or $(RADIXSERVE_CACHE_DIR),$(HOME)/.cache/radixserve)" in makefile
    assert re.search(r"^clean-cache:", makefile, flags=re.MULTILINE)
    for words in ("~/.cache/radixserve", "RADIXSERVE_CACHE_DIR", "make clean-cache", "0.5 GB"):
        assert words in local, words
    operations = (REPO_ROOT / "docs" / "operations.md").read_text()
    operations = " ".join(operations.split())  # words broken across lines joined
    for words in ("~/.cache/radixserve", "RADIXSERVE_CACHE_DIR", "make clean-cache"):
        assert words in operations, words


def test_the_readmes_links_lead_to_files_and_include_the_api_reference() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    local = [link for link in links if "://" not in link]
    assert "docs/api.md" in local
    for link in local:
        assert (REPO_ROOT / link).is_file(), link


@pytest.fixture
def fake_venv(tmp_path: Path) -> Path:
    """A virtualenv whose `radixserve` only prints its arguments, its setup already done."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()
    script = venv / "bin" / "radixserve"
    script.write_text('#!/bin/sh\necho "radixserve $*"\n')
    script.chmod(0o755)
    return venv


def make(args: list[str], venv: Path, **env: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("no make")
    return subprocess.run(
        ["make", "-s", "-C", str(REPO_ROOT), "-o", f"{venv}/.installed", f"VENV={venv}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k not in {"HOST", "PORT", "ARGS"}} | env,
    )


def test_make_serve_says_where_it_listens_its_knobs_and_its_cache(
    fake_venv: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    (cache / "dequantized").mkdir(parents=True)
    done = make(["serve"], fake_venv, RADIXSERVE_CACHE_DIR=str(cache))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "radixserve serve --host 127.0.0.1 --port 8000"
    text = "\n".join(lines[:-1])
    assert "http://127.0.0.1:8000/v1" in text and "HOST=0.0.0.0" in text
    assert "PORT=8000" in text and "ARGS=" in text
    assert str(cache) in text and "make clean-cache" in text
    assert "no API key" not in text

    done = make(["serve", "HOST=0.0.0.0", "PORT=9001", "ARGS=--max-total-tokens 64"], fake_venv)
    assert done.stdout.splitlines()[-1] == (
        "radixserve serve --host 0.0.0.0 --port 9001 --max-total-tokens 64"
    )
    assert "no API key" in done.stdout and "http://localhost:9001/v1" in done.stdout

    # tcsh's HOST (the machine's name, exported) is not a request to listen beyond loopback
    if shutil.which("hostname"):
        done = make(["serve"], fake_venv, HOST=socket.gethostname())
        assert done.stdout.splitlines()[-1] == "radixserve serve --host 127.0.0.1 --port 8000"


def test_make_clean_cache_removes_the_cache_and_make_clean_keeps_it(
    fake_venv: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    (cache / "dequantized").mkdir(parents=True)
    clean = make(["-n", "clean"], fake_venv, RADIXSERVE_CACHE_DIR=str(cache))
    assert "rm -rf" in clean.stdout and f"rm -rf {cache}" not in clean.stdout
    assert "make clean-cache" in clean.stdout
    done = make(["clean-cache"], fake_venv, RADIXSERVE_CACHE_DIR=str(cache))
    assert done.returncode == 0 and not cache.exists(), done.stdout + done.stderr
    assert str(cache) in done.stdout
    assert cache_root() == Path(
        os.environ.get("RADIXSERVE_CACHE_DIR") or Path.home() / ".cache" / "radixserve"
    )


def test_make_bench_runs_a_benchmark_that_exists() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [line for line in makefile.splitlines() if "radixserve bench" in line]
    argv = shlex.split(line.split("$(BIN)/radixserve", 1)[1])
    args = build_parser(argv).parse_args(argv)  # argparse exits on an unknown benchmark or flag
    assert (args.command, args.benchmark) == ("bench", "offline")
    assert args.model == ServerArgs().model


def test_make_test_runs_pytest_with_the_virtualenvs_tools_and_the_machines_path() -> None:
    """The suite finds prometheus and promtool in .venv and bash, git and curl on the machine:
    an empty PATH (an undefined make variable) failed every test that runs one of them."""
    dry_run = subprocess.run(
        ["make", "-n", "test"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert dry_run.returncode == 0, dry_run.stderr
    line = next(line for line in dry_run.stdout.splitlines() if "-m pytest" in line)
    path = line.split()[0].removeprefix("PATH=").strip('"').split(":")
    assert path[0] == str(REPO_ROOT / ".venv" / "bin")
    assert set(os.environ["PATH"].split(":")) <= set(path[1:])
