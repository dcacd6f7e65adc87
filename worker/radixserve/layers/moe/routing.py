"""DeepSeek's expert choice: grouped top-k over float32 router logits, as transformers'
DeepseekV3TopkRouter (`noaux_tc`) and DeepseekV2TopkRouter (`greedy`, `group_limited_greedy`)
compute it. Plain torch (topk, scatter, masks): no host sync, so it runs inside captured CUDA
graphs as it is. It is the CPU's routing and the reference of the CUDA path's one-launch
kernels (kernels/fused_moe.py: `select_experts` for V2-Lite's greedy choice,
`select_experts_noaux_tc` for V3's), which replace its dozen small kernels a MoE layer.
"""

from __future__ import annotations

import torch


def grouped_topk(
    logits: torch.Tensor,
    top_k: int,
    *,
    method: str,
    n_group: int = 1,
    topk_group: int = 1,
    correction_bias: torch.Tensor | None = None,
    renormalize: bool = False,
    scaling: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] float32 -> (weights [T, top_k] float32, expert ids [T, top_k] int32, as the
    fused MoE kernels take them).

    - `noaux_tc` (V3): sigmoid scores; experts are *chosen* by score + correction_bias,
      within the `topk_group` best of `n_group` groups (a group's worth: the sum of its two
      best biased scores), and *weighted* by their unbiased scores.
    - `group_limited_greedy` (V2): softmax scores, groups ranked by their best expert.
    - `greedy` (V2-Lite): softmax scores, top-k over all experts.

    Then renormalised to sum 1 when `renormalize`, and times `scaling` (routed_scaling_factor).
    """
    num_experts = logits.shape[-1]
    if method == "noaux_tc":
        scores = logits.sigmoid()
        choice = scores if correction_bias is None else scores + correction_bias
        group_worth = choice.view(-1, n_group, num_experts // n_group).topk(2, dim=-1)[0].sum(-1)
        choice = _keep_groups(choice, group_worth, topk_group, float("-inf"))
        ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
    else:
        scores = logits.softmax(dim=-1, dtype=torch.float32)
        if method == "group_limited_greedy":
            group_worth = scores.view(-1, n_group, num_experts // n_group).max(dim=-1).values
            scores = _keep_groups(scores, group_worth, topk_group, 0.0)
        weights, ids = torch.topk(scores, k=top_k, dim=-1, sorted=False)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if scaling != 1.0:
        weights = weights * scaling
    return weights, ids.to(torch.int32)


def _keep_groups(
    scores: torch.Tensor, group_worth: torch.Tensor, topk_group: int, fill: float
) -> torch.Tensor:
    """`scores` with every expert outside the `topk_group` best groups set to `fill`."""
    n_group = group_worth.shape[-1]
    best = torch.topk(group_worth, k=topk_group, dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_worth, dtype=torch.bool).scatter_(1, best, True)
    keep = keep.unsqueeze(-1).expand(-1, n_group, scores.shape[-1] // n_group).reshape_as(scores)
    return scores.masked_fill(~keep, fill)
