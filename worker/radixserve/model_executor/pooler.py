"""Pooling instead of sampling: what an embedding or reranking model (`--task embed|rerank`,
catalog/model_tasks.py) makes of a prefill pass's final hidden states.

On the device, per request row of an extend pass:

- embed, last-token pooling: the hidden state of the row's last token;
- embed, mean pooling: the sum of the row's hidden states in this pass (a prompt prefilled in
  chunks sums chunk by chunk; the scheduler adds the chunks and divides by the prompt length);
- rerank with a score head (`*ForSequenceClassification`): sigmoid(score . h_last);
- rerank by a causal LM's "yes"/"no" tokens (Qwen3-Reranker): sigmoid(logit_yes - logit_no),
  i.e. softmax over the two at the last position, as the model card computes it.

The host finishes an embedding (`finish_embedding`): the mean's division, the Matryoshka cut to
`dimensions`, then the L2 normalisation the checkpoint asks for (after the cut, so a cut vector
is a unit vector too). Everything is float32 from the hidden state on.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.catalog.model_tasks import ModelTask
from radixserve.forward.forward_batch import ForwardBatch

# checkpoint prefixes the causal LM's loader knows; a sentence-transformers embedder saved
# from the bare transformer (Qwen3-Embedding: "layers.0...", "embed_tokens.weight") lacks the
# "model." its weights have in a causal LM
_LM_PREFIXES = ("model.", "lm_head.", "score.")


class Pooler(nn.Module):
    """The pooled output of a pass, [bs, hidden] for embed or [bs, 1] for rerank (float32).
    A score head's weight (`score.weight`) is a parameter here, read from the checkpoint by
    `take_head_weights`."""

    def __init__(self, task: ModelTask, hidden_size: int, yes_no_ids: tuple[int, int] | None):
        super().__init__()
        self.task = task
        self.score: nn.Linear | None = None
        if task.head == "score":
            self.score = nn.Linear(hidden_size, 1, bias=False)
        if task.head == "yes_no" and yes_no_ids is None:
            raise ValueError("--task rerank on a causal LM needs 'yes' and 'no' tokens")
        self.yes_no_ids = yes_no_ids
        self._score_loaded = False

    def take_head_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors for the causal LM (names given their "model." where the
        checkpoint left it out), keeping the score head's for this module. Raises at the end
        when a score head was expected and not found."""
        for name, tensor in weights:
            if name == "score.weight" and self.score is not None:
                with torch.no_grad():
                    self.score.weight.copy_(tensor.reshape(self.score.weight.shape))
                self._score_loaded = True
                continue
            if not name.startswith(_LM_PREFIXES):
                name = f"model.{name}"
            yield name, tensor
        if self.score is not None and not self._score_loaded:
            raise ValueError("the classifier checkpoint has no score.weight")

    @torch.no_grad()
    def forward(
        self, lm: nn.Module, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """`lm`: the causal LM (its LM head scores yes/no); `hidden`: its final, normed hidden
        states of this extend pass, [num_tokens, hidden]."""
        starts, lengths = forward_batch.extend_start_loc, forward_batch.extend_seq_lens
        if self.task.head == "yes_no":
            logits = lm.logits_processor(hidden, lm.lm_head_weight, forward_batch)
            yes, no = self.yes_no_ids
            return torch.sigmoid(logits[:, yes] - logits[:, no]).unsqueeze(-1)
        last = hidden[starts + lengths - 1].float()
        if self.score is not None:
            return torch.sigmoid(last @ self.score.weight.float().T)
        if self.task.pooling == "mean":
            rows = torch.repeat_interleave(
                torch.arange(len(lengths), device=hidden.device),
                lengths,
                output_size=hidden.shape[0],
            )
            sums = torch.zeros(len(lengths), hidden.shape[1], device=hidden.device)
            return sums.index_add_(0, rows, hidden.float())
        return last


def finish_embedding(
    pooled: torch.Tensor, task: ModelTask, num_tokens: int, dimensions: int | None
) -> torch.Tensor:
    """A request's embedding from its pooled row (for mean pooling the sum over its
    `num_tokens` prompt tokens): the mean, the cut to `dimensions`, the normalisation."""
    vector = pooled / num_tokens if task.pooling == "mean" else pooled
    if dimensions is not None:
        vector = vector[:dimensions]
    if task.normalize:
        vector = F.normalize(vector, dim=-1)
    return vector
