"""ModelWorker: runs one ModelWorkerBatch to sampled tokens, and is the boundary the
scheduler talks to (the overlap scheduler later wraps it in a thread)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.managers.schedule_batch import ModelWorkerBatch
from radixserve.model_executor.model_runner import ModelRunner
from radixserve.model_loader.loader import ModelSource
from radixserve.server_args import ServerArgs


@dataclass
class GenerationBatchResult:
    next_token_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[int, float]]] | None


class ModelWorker:
    def __init__(self, server_args: ServerArgs, source: ModelSource) -> None:
        self.model_runner = ModelRunner(server_args, source)

    @torch.inference_mode()
    def forward_batch_generation(self, batch: ModelWorkerBatch) -> GenerationBatchResult:
        runner = self.model_runner
        logits, forward_batch = runner.forward(batch)
        out = runner.sample(logits, forward_batch)
        batch.sampling_info.update_with_new_tokens(out.next_token_ids)
        # the one host sync of a step: the sampled tokens
        return GenerationBatchResult(
            next_token_ids=out.next_token_ids.tolist(),
            logprobs=out.logprobs.tolist() if out.logprobs is not None else None,
            top_logprobs=out.top_logprobs,
        )
