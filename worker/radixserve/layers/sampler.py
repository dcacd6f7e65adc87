"""Turns one step's logits into next tokens: penalties, greedy or filtered random sampling.

Order per step: logprobs from the RAW logits (what OpenAI reports), then the batch's logit
processors (penalties, min_new_tokens), then greedy rows take the argmax (kernels/argmax.py,
torch.argmax's result: bit-for-bit what transformers' greedy search picks) while the other rows
are divided by their temperature, filtered by top-k, top-p and min-p and sampled by Gumbel-max
with the batch's counter-based noise (see SamplingBatchInfo.gumbel_noise), so seeded rows are
reproducible.

A filter that a row does not use is an exact no-op on that row, so a row's result never depends
on which filters the other rows in its batch switched on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from radixserve.kernels.argmax import argmax
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo


@dataclass
class SamplerOutput:
    next_token_ids: torch.Tensor  # [bs] int64 (device)
    logprobs: torch.Tensor | None  # [bs] float32: logprob of the chosen token
    top_logprobs: list[list[tuple[int, float]]] | None  # per request, (id, logprob), best first


def allowed_tokens(scaled_logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """`[bs, vocab]` bool: the tokens each row may sample after top-k, top-p and min-p.

    Top-k keeps every token at least as likely as the k-th most likely one (ties at the
    boundary all stay), so it needs only `topk`, not a sort of the vocabulary (slow on CPU);
    the sort is paid only for top-p. Top-p is taken over the top-k survivors renormalized (as
    transformers and vLLM do); min-p is relative to the most likely token, so renormalizing
    does not change it. The most likely token always survives."""
    probs = torch.softmax(scaled_logits, dim=-1)
    vocab_size = probs.shape[-1]
    top_k_on = info.top_ks < vocab_size  # [bs, 1]
    keep = torch.ones_like(probs, dtype=torch.bool)
    if info.need_top_p:
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
        kth_prob = sorted_probs.gather(1, info.top_ks.clamp(max=vocab_size) - 1)
        in_top_k = sorted_probs >= kth_prob
        kept_probs = sorted_probs.masked_fill(~in_top_k, 0.0)
        renormalized = torch.where(
            top_k_on, kept_probs / kept_probs.sum(dim=-1, keepdim=True), kept_probs
        )
        mass_before = renormalized.cumsum(dim=-1) - renormalized
        beyond_top_p = (mass_before >= info.top_ps) & (info.top_ps < 1.0)
        keep = torch.zeros_like(keep).scatter_(1, order, in_top_k & ~beyond_top_p)
    elif info.need_top_k:
        top_probs = probs.topk(min(info.max_top_k, vocab_size), dim=-1).values
        kth_prob = top_probs.gather(1, info.top_ks.clamp(max=top_probs.shape[-1]) - 1)
        keep = (probs >= kth_prob) | ~top_k_on
    if info.need_min_p:
        max_probs = probs.max(dim=-1, keepdim=True).values
        keep &= probs >= max_probs * info.min_ps
    return keep


def sample_rows(
    logits: torch.Tensor, info: SamplingBatchInfo, step_offset: int = 0
) -> torch.Tensor:
    """Next token per row of a batch with at least one non-greedy row. `step_offset`: the token
    is the row's `num_generated + step_offset`-th (a verify step samples several positions
    ahead, each with the noise a plain decode of that token would draw)."""
    scaled = logits / info.temperatures
    if info.need_top_k or info.need_top_p or info.need_min_p:
        scaled = scaled.masked_fill(~allowed_tokens(scaled, info), float("-inf"))
    sampled = argmax(scaled + info.gumbel_noise(step_offset))
    return torch.where(info.greedy, argmax(logits), sampled)


def _top_logprobs(
    logprobs: torch.Tensor, top_logprobs_nums: list[int]
) -> list[list[tuple[int, float]]]:
    """Per row, its `top_logprobs_nums[i]` most likely (id, logprob), best first (one topk and
    one device-to-host copy for the whole batch)."""
    k = min(max(top_logprobs_nums, default=0), logprobs.shape[-1])
    if k == 0:
        return [[] for _ in top_logprobs_nums]
    values, ids = logprobs.topk(k, dim=-1, sorted=True)
    values, ids = values.tolist(), ids.tolist()
    return [
        list(zip(ids[i][:num], values[i][:num], strict=True))
        for i, num in enumerate(top_logprobs_nums)
    ]


class Sampler(nn.Module):
    """Stateless; all per-request state lives in the SamplingBatchInfo passed in."""

    def forward(
        self,
        logits: torch.Tensor,
        sampling_info: SamplingBatchInfo,
        return_logprob: bool = False,
        top_logprobs_nums: list[int] | None = None,
    ) -> SamplerOutput:
        """Sample `[bs]` next tokens from `[bs, vocab]` logits. Float32 logits are modified in
        place by the penalties (the caller must not reuse them)."""
        logits = logits.float()
        raw_logprobs = torch.log_softmax(logits, dim=-1) if return_logprob else None
        sampling_info.apply_logits_processors(logits)
        if sampling_info.is_all_greedy:
            next_token_ids = argmax(logits)
        else:
            next_token_ids = sample_rows(logits, sampling_info)

        if raw_logprobs is None:
            return SamplerOutput(next_token_ids, None, None)
        chosen = raw_logprobs.gather(1, next_token_ids.unsqueeze(1)).squeeze(1)
        top = None if top_logprobs_nums is None else _top_logprobs(raw_logprobs, top_logprobs_nums)
        return SamplerOutput(next_token_ids, chosen, top)
