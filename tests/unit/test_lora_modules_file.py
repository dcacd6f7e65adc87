"""--lora-modules-file: the operator's adapter list (a mounted ConfigMap), read at engine start."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.contract import parse_server_args


def test_the_file_is_read_when_asked_not_when_parsed(tmp_path: Path) -> None:
    modules = tmp_path / "modules"
    args = parse_server_args(
        ["--lora-modules-file", str(modules), "--lora-modules", "a=/adapters/a"]
    )
    assert args.max_loras == 4  # LoRA is on, as with --lora-modules
    modules.write_text("# the operator's list\n\nb=/models/cache/b\n  c=hf://org/c  \n")
    assert args.lora_module_paths() == {
        "a": "/adapters/a",
        "b": "/models/cache/b",
        "c": "hf://org/c",
    }
    modules.write_text("b=/models/cache/b\n")  # the list changed while the pod ran
    assert args.lora_module_paths() == {"a": "/adapters/a", "b": "/models/cache/b"}


@pytest.mark.parametrize("lines", ["a=/x\na=/y\n", "no-path\n", "=/x\n", "base=/x\n"], ids=repr)
def test_bad_lines_are_refused_like_the_flag(tmp_path: Path, lines: str) -> None:
    modules = tmp_path / "modules"
    modules.write_text(lines)
    args = parse_server_args(["--lora-modules-file", str(modules), "--served-model-name", "base"])
    with pytest.raises(ValueError, match="--lora-modules"):
        args.lora_module_paths()


def test_without_the_flags_lora_stays_off() -> None:
    args = parse_server_args([])
    assert args.max_loras == 0 and args.lora_module_paths() == {}


def test_lazy_loading_keeps_the_host_bound_of_max_cpu_loras() -> None:
    modules = [f"a{i}=/adapters/a{i}" for i in range(3)]
    flags = [arg for module in modules for arg in ("--lora-modules", module)]
    # eager: the flag's adapters are read at start and all stay read
    assert parse_server_args(flags + ["--max-cpu-loras", "1"]).max_cpu_loras == 3
    lazy = parse_server_args(flags + ["--max-cpu-loras", "1", "--lora-load", "lazy"])
    assert lazy.lora_load == "lazy" and lazy.max_cpu_loras == 1
    with pytest.raises(SystemExit):
        parse_server_args(["--lora-load", "sometimes"])
