"""Random PEFT LoRA adapters for a tiny random Llama, saved as PEFT saves them, and PEFT's own
greedy output for each: the reference the engine's adapters are checked against."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

# (name, rank, alpha, target modules): different ranks, attention only, MLP only, all
ADAPTERS = [
    ("alpha", 4, 8, ["q_proj", "k_proj", "v_proj", "o_proj"]),
    ("beta", 8, 16, ["gate_proj", "up_proj", "down_proj"]),
    ("gamma", 16, 8, ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
]


# the bundled SmolLM2-135M's shapes: (in, out) of the projections write_smollm2_adapter targets
SMOLLM2_HIDDEN, SMOLLM2_KV, SMOLLM2_LAYERS = 576, 192, 30
SMOLLM2_SHAPES = {
    "q_proj": (SMOLLM2_HIDDEN, SMOLLM2_HIDDEN),
    "v_proj": (SMOLLM2_HIDDEN, SMOLLM2_KV),
    "o_proj": (SMOLLM2_HIDDEN, SMOLLM2_HIDDEN),
}


# random:tiny-llama's (hidden 64, 2 KV heads of 16, 2 layers)
TINY_LLAMA_SHAPES = {"q_proj": (64, 64), "v_proj": (64, 32), "o_proj": (64, 64)}
TINY_LLAMA_LAYERS = 2


def write_random_adapter(
    directory: Path, rank: int, seed: int, shapes: dict[str, tuple[int, int]], layers: int
) -> Path:
    """A PEFT adapter with random A and B for the attention projections `shapes` ((in, out) by
    module) of every layer, as PEFT lays it out, without loading the model."""
    directory.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for module, (fan_in, fan_out) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) * 0.1
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * 0.1
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}
    config["target_modules"] = list(shapes)
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def write_smollm2_adapter(
    directory: Path, rank: int, seed: int, in_features: int = SMOLLM2_HIDDEN
) -> Path:
    """A PEFT adapter for the bundled SmolLM2 (q, v, o of every layer) with random A and B;
    `in_features` other than the model's makes one for another model."""
    shapes = {**SMOLLM2_SHAPES, "q_proj": (in_features, SMOLLM2_HIDDEN)}
    return write_random_adapter(directory, rank, seed, shapes, SMOLLM2_LAYERS)


def save_adapter(
    hf_model, directory: Path, rank: int, alpha: int, targets: list[str], seed: int
) -> Path:
    """A PEFT LoRA adapter with random A and non-zero random B (PEFT's own init leaves B zero,
    which would hide any mistake), written with save_pretrained."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0)
    peft_model = get_peft_model(copy.deepcopy(hf_model), config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    peft_model.save_pretrained(str(directory))
    return directory


def peft_greedy(hf_model, adapter_dir: Path | None, prompt: list[int], new: int) -> list[int]:
    """PEFT's model (the adapter merged into nothing: its LoRA layers run) generating greedily."""
    from peft import PeftModel

    model = hf_model
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(copy.deepcopy(hf_model), str(adapter_dir)).eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@contextlib.contextmanager
def tp2_engine_with_adapters(tmp_path: Path, device: str, **engine_kw) -> Iterator[tuple]:
    """An Engine of random:tiny-llama with --tp-size 2 on `device` serving the three adapters
    (`engine_kw` adds or overrides its arguments), after the base and the adapters, two prompts
    each, were sent to it at once: (the engine, every job's output ids, PEFT's greedy tokens for
    each job, the jobs). Random weights are drawn on the device they are for: the reference
    holds that draw, moved to the CPU."""
    from engine_harness import random_prompts

    from radixserve.frontend.engine import Engine
    from radixserve.model_loader.loader import build_hf_reference, load_model_source

    source = load_model_source("random:tiny-llama", device=device, dtype="float32")
    hf = build_hf_reference(source).cpu()
    dirs = {
        name: save_adapter(hf, tmp_path / name, rank, alpha, targets, seed)
        for seed, (name, rank, alpha, targets) in enumerate(ADAPTERS)
    }
    prompts = random_prompts(2, source.config.vocab_size, 5, 30, seed=33)
    jobs = [(name, p) for name in [None, *dirs] for p in prompts]
    expected = [peft_greedy(hf, dirs.get(name), p, 8) for name, p in jobs]
    params = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    args = {
        "model": "random:tiny-llama",
        "device": device,
        "dtype": "float32",
        "tp_size": 2,
        "max_total_tokens": 4096,
        "lora_modules": [f"{name}={path}" for name, path in dirs.items()],
        "max_loras": 3,
    }
    with Engine(**(args | engine_kw)) as engine:

        async def all_at_once() -> list[dict]:
            return await asyncio.gather(
                *(
                    engine.async_generate(input_ids=p, sampling_params=params, lora_name=name)
                    for name, p in jobs
                )
            )

        outs = asyncio.run(all_at_once())
        yield engine, [o["output_ids"] for o in outs], expected, jobs
