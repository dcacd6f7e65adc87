"""A model we cannot serve fails at start, as `radixserve serve` run by a user: one line that
names what is unsupported and lists what is, a non-zero exit status, no traceback, and nothing
started (the port never listens, no scheduler process was spawned)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from radixserve.bench.server_process import free_port
from radixserve.catalog.architectures import SUPPORTED_ARCHITECTURES

# the refusal lists every served architecture, from the one list of them
SERVED = "supported: " + ", ".join(sorted(SUPPORTED_ARCHITECTURES.values()))
TINY = {
    "vocab_size": 256,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
}


def serve(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    port = free_port()
    command = [sys.executable, "-m", "radixserve.entrypoints.cli", "serve", "--port", str(port)]
    proc = subprocess.run(
        [*command, "--host", "127.0.0.1", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, port


def checkpoint(tmp_path: Path, config: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the check comes first
    return str(tmp_path)


def assert_refused(proc: subprocess.CompletedProcess, port: int, *named: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr
    for text in named:
        assert text in errors[0], errors[0]
    # nothing half-started: no model load began, and the port is free
    assert "loading" not in proc.stderr and "scheduler" not in proc.stderr, proc.stderr
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_architecture_transformers_knows_but_we_do_not_serve(tmp_path):
    model = checkpoint(
        tmp_path, {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 1}
    )
    proc, port = serve("--model", model)
    assert_refused(proc, port, "unsupported architecture 'GPT2LMHeadModel'", SERVED)


def test_architecture_nobody_knows(tmp_path):
    config = {"model_type": "frobnicator", "architectures": ["FrobnicatorForCausalLM"], **TINY}
    proc, port = serve("--model", checkpoint(tmp_path, config))
    assert_refused(proc, port, "'FrobnicatorForCausalLM'", SERVED, "Qwen3MoeForCausalLM")


def test_checkpoint_quantized_with_a_method_we_do_not_know(tmp_path):
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **TINY,
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
    }
    proc, port = serve("--model", checkpoint(tmp_path, config))
    assert_refused(proc, port, "'awq'", "supported: fp8, compressed-tensors")


def test_compressed_tensors_scheme_we_do_not_serve(tmp_path):
    int4 = {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}, "targets": ["Linear"]}
    config = {
        "model_type": "qwen2",
        **TINY,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {"group_0": int4},
        },
    }
    proc, port = serve("--model", checkpoint(tmp_path, config))
    assert_refused(proc, port, "4-bit int", "supported: 8-bit float")


@pytest.mark.parametrize("method", ["int4", "gptq"])
def test_quantization_flag_we_do_not_know(method):
    proc, port = serve("--model", "random:tiny-llama", "--quantization", method)
    assert proc.returncode == 2  # argparse's status for a refused flag (after its usage text)
    assert "Traceback" not in proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert f"--quantization: invalid choice: '{method}'" in error and "fp8" in error, error
