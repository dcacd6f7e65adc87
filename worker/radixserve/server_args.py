"""Every knob of the worker in one dataclass, shared by the CLI, the Engine and the scheduler.

One place for defaults means the CLI, the in-process Engine and the operator's generated
arguments cannot drift apart; `add_cli_args`/`from_cli_args` derive the flags from the fields.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

BUILTIN_SMOLLM2 = "builtin:smollm2-135m"


@dataclass
class ServerArgs:
    model: str = BUILTIN_SMOLLM2
    served_model_name: str | None = None
    host: str = "0.0.0.0"
    port: int = 8000
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    attention_backend: str = "auto"  # auto | torch_native | triton | flashinfer
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    context_length: int | None = None
    chunked_prefill_size: int = 2048
    max_prefill_tokens: int = 16384
    mem_fraction_static: float = 0.85
    schedule_policy: str = "lpm"  # lpm | fcfs
    # Run the running batch's decode step inside a prefill pass (ForwardMode.MIXED) instead of
    # pausing decode while a long prompt is prefilled chunk by chunk.
    enable_mixed_chunk: bool = False
    disable_radix_cache: bool = False
    disable_cuda_graph: bool = False
    # every batch of the default --max-running-requests (256 on CUDA) replays a graph
    cuda_graph_max_bs: int = 256
    disable_overlap: bool = False
    tp_size: int = 1
    max_queued_requests: int = 1024
    drain_timeout: float = 30.0
    random_seed: int = 0
    log_level: str = "info"
    # Fraction of a running request's remaining max_new_tokens the admission check
    # reserves; retraction corrects for the optimism of a value below 1.
    new_token_ratio: float = 0.7

    def __post_init__(self) -> None:
        if self.served_model_name is None:
            self.served_model_name = _default_served_name(self.model)
        choices = {
            "device": ("auto", "cpu", "cuda"),
            "dtype": ("auto", "float32", "bfloat16", "float16"),
            "attention_backend": ("auto", "torch_native", "triton", "flashinfer"),
            "schedule_policy": ("lpm", "fcfs"),
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be one of {allowed}, got {value!r}"
                )
        if self.chunked_prefill_size <= 0:
            raise ValueError("--chunked-prefill-size must be positive")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError("--mem-fraction-static must be in (0, 1)")
        if self.tp_size < 1:
            raise ValueError("--tp-size must be >= 1")

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(ServerArgs):
            flag = "--" + f.name.replace("_", "-")
            default = f.default
            if isinstance(default, bool):
                parser.add_argument(flag, action="store_true", default=default)
            elif f.name in ("max_running_requests", "max_total_tokens", "context_length"):
                parser.add_argument(flag, type=int, default=default)
            elif f.name == "served_model_name":
                parser.add_argument(flag, type=str, default=None)
            else:
                parser.add_argument(flag, type=type(default), default=default)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})


def _default_served_name(model: str) -> str:
    if model == BUILTIN_SMOLLM2:
        return "smollm2-135m"
    if model.startswith("random:"):
        return model
    return model.rstrip("/").split("/")[-1].removesuffix(".gguf")
