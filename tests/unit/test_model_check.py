"""The front end's model check on a checkpoint directory runs on the raw config.json with
neither torch nor transformers imported: the scheduler process waits for its verdict, so the
check's imports were the slowest part of a warm start. Its verdicts are the loader's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from radixserve.frontend.engine import EngineStartupError, check_model
from radixserve.server_args import ServerArgs

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
FP8_CHANNEL = {
    "quant_method": "compressed-tensors",
    "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
}


def checkpoint(root: Path, config: dict) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    return str(root)


@pytest.mark.parametrize("form", ["directory", "bundled"])
def test_checked_without_torch_or_transformers(tmp_path, form):
    """A checkpoint directory and the bundled model: the scheduler waits for this verdict."""
    model = checkpoint(tmp_path / "llama", LLAMA) if form == "directory" else "builtin:smollm2-135m"
    probe = textwrap.dedent(
        f"""
        import sys
        from radixserve.frontend.engine import check_model
        from radixserve.server_args import ServerArgs
        check_model(ServerArgs(model={model!r}))
        print(sorted({{"torch", "transformers"}} & set(sys.modules)))
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


@pytest.mark.parametrize(
    ("config", "quantization", "message"),
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, None, "GPT2LMHeadModel"),
        ({**LLAMA, "architectures": ["MistralForCausalLM"]}, None, "unsupported architecture"),
        ({**LLAMA, "quantization_config": {"quant_method": "awq"}}, None, "'awq'"),
        (LLAMA, "int4", "unsupported quantization method 'int4'"),
        (
            {**LLAMA, "quantization_config": {**FP8_CHANNEL, "config_groups": {}}},
            None,
            "without config_groups",
        ),
        (
            {
                **LLAMA,
                "quantization_config": {
                    **FP8_CHANNEL,
                    "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
                },
            },
            None,
            "4-bit int",
        ),
    ],
)
def test_what_cannot_be_served_is_refused_in_one_line(tmp_path, config, quantization, message):
    model = checkpoint(tmp_path / "m", config)
    with pytest.raises(EngineStartupError, match=message):
        check_model(ServerArgs(model=model, quantization=quantization))


@pytest.mark.parametrize(
    ("config", "quantization"),
    [
        (LLAMA, None),
        (LLAMA, "fp8"),  # quantized at load
        ({**LLAMA, "quantization_config": FP8_CHANNEL}, None),
        ({**LLAMA, "quantization_config": FP8_CHANNEL}, "fp8"),
        ({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}, None),
    ],
)
def test_what_can_be_served_passes(tmp_path, config, quantization):
    check_model(ServerArgs(model=checkpoint(tmp_path / "m", config), quantization=quantization))


def test_a_path_that_names_nothing_is_refused(tmp_path):
    with pytest.raises(EngineStartupError, match="cannot load model"):
        check_model(ServerArgs(model=str(tmp_path / "nothing-here")))
