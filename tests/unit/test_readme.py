"""The README's local example works as written: the model it asks for is the one `make serve`
serves, and the benchmark `make bench` runs exists and accepts its arguments."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from radixserve.entrypoints.cli import build_parser
from radixserve.server_args import ServerArgs

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_local_curl_asks_for_the_model_make_serve_serves() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    local = readme[: readme.index("## On Kubernetes")]
    (body,) = re.findall(r"-d '(\{.*?\})'", local, flags=re.DOTALL)
    request = json.loads(body)
    assert request["model"] == ServerArgs().served_model_name == "smollm2-135m"
    assert request["temperature"] == 0
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "$(BIN)/radixserve serve --port $(PORT)" in makefile  # no --model: the bundled one


def test_make_bench_runs_a_benchmark_that_exists() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [line for line in makefile.splitlines() if "radixserve bench" in line]
    argv = shlex.split(line.split("$(BIN)/radixserve", 1)[1])
    args = build_parser(argv).parse_args(argv)  # argparse exits on an unknown benchmark or flag
    assert (args.command, args.benchmark) == ("bench", "offline")
    assert args.model == ServerArgs().model
