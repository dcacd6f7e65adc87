"""What a served model does (`--task`): generate text, embed text, or score (rerank) pairs,
and how its vectors and scores are made. Torch-free: the scheduler resolves it from the
checkpoint at start and reports it, and the front end routes its endpoints by it.

Detection follows what sentence-transformers saves and vLLM and SGLang read:

- an architecture `*ForSequenceClassification` (a score head, `score.weight`, one label): rerank,
  scored by sigmoid(score . h_last);
- a sentence-transformers directory (`modules.json` with a Pooling module, e.g.
  Qwen3-Embedding): embed, pooled as `1_Pooling/config.json` says (last token or mean),
  normalised when the modules include `Normalize`;
- an architecture `*Model` (a transformer saved without its LM head, e.g. e5-mistral's
  MistralModel): embed, last token, normalised;
- a causal LM whose name says it is a reranker (Qwen3-Reranker): rerank by the logits of
  "yes" and "no" at the last position, sigmoid(yes - no) (vLLM's conversion of that model
  into a one-label classifier);
- anything else: generate.

`--task embed` on a causal LM without sentence-transformers files pools its last token and
normalises (vLLM's default for decoder embedders); `--task rerank` on one scores by its "yes"
and "no" tokens.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TASKS = ("generate", "embed", "rerank")
POOLING_TYPES = ("last", "mean")
# rerank heads: a classifier's score.weight, or a causal LM's "yes" - "no" logits
HEADS = ("none", "score", "yes_no")
CLASSIFIER_SUFFIX = "ForSequenceClassification"
# sentence-transformers' module types that matter here
_POOLING_MODULE = "sentence_transformers.models.Pooling"
_NORMALIZE_MODULE = "sentence_transformers.models.Normalize"
# what a served embedder's modules.json may hold: any other module (Dense projections, say)
# changes the vector in a way the pooler does not reproduce
_SERVED_MODULES = {"sentence_transformers.models.Transformer", _POOLING_MODULE, _NORMALIZE_MODULE}


class TaskError(ValueError):
    """A --task the checkpoint cannot do, or a pooling it asks for that is not supported."""


@dataclass(frozen=True)
class ModelTask:
    """The resolved task of a served model; `pooling`, `normalize` and `head` matter only for
    embed and rerank."""

    task: str = "generate"
    pooling: str = "last"
    normalize: bool = False
    head: str = "none"
    # why this task (for the start-up log)
    reason: str = "the default"

    @property
    def pools(self) -> bool:
        """Whether the model pools (embed, rerank) instead of sampling."""
        return self.task != "generate"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_task(
    requested: str, config: dict[str, Any], directory: Path | None, name: str = ""
) -> ModelTask:
    """The task of a model: `requested` (`auto` or one of TASKS), its raw config (a dict), its
    checkpoint directory (None for GGUF files and random weights) and the name it was given
    (`--model`). Raises TaskError."""
    architecture = (config.get("architectures") or [""])[0] or ""
    if config.get("use_bidirectional_attention"):
        raise TaskError(
            f"{architecture or 'this model'} attends bidirectionally (use_bidirectional_attention,"
            " e.g. EmbeddingGemma); the worker's attention is causal"
        )
    classifier = architecture.endswith(CLASSIFIER_SUFFIX)
    st_pooling = _sentence_transformers_pooling(directory)
    name = name.rstrip("/").rsplit("/", 1)[-1].lower()
    if classifier:
        labels = config.get("num_labels") or len(config.get("id2label") or {}) or 1
        if labels != 1:
            raise TaskError(
                f"{architecture} has {labels} labels; only one-label classifiers (a relevance "
                "score) are served"
            )
        if requested not in ("auto", "rerank"):
            raise TaskError(f"{architecture} is a classifier: it serves --task rerank only")
        return ModelTask("rerank", head="score", reason=f"architecture {architecture}")
    bare = architecture.endswith("Model")  # saved without an LM head: an embedder
    if requested == "generate":
        if bare:
            raise TaskError(f"{architecture} has no LM head: it serves --task embed only")
        return ModelTask(reason="--task generate")
    if requested == "rerank":
        return ModelTask("rerank", head="yes_no", reason="--task rerank")
    if st_pooling is not None:
        if requested == "auto" and "reranker" in name:
            return ModelTask("rerank", head="yes_no", reason="a reranker by its name")
        pooling, normalize = st_pooling
        return ModelTask("embed", pooling, normalize, reason="sentence-transformers modules.json")
    if requested == "embed" or bare:
        return ModelTask("embed", "last", True, reason=f"--task {requested} on {architecture}")
    if "reranker" in name:
        return ModelTask("rerank", head="yes_no", reason="a reranker by its name")
    if "embedding" in name:
        return ModelTask("embed", "last", True, reason="an embedding model by its name")
    return ModelTask()


def _sentence_transformers_pooling(directory: Path | None) -> tuple[str, bool] | None:
    """(pooling, normalize) from a sentence-transformers directory, None for other
    directories. Pooling modes other than last token and mean are refused (CLS pooling reads
    the first token, whose hidden state a prefix-cache hit never recomputes)."""
    if directory is None or not (directory / "modules.json").is_file():
        return None
    try:
        modules = json.loads((directory / "modules.json").read_text())
        pooling_module = next(m for m in modules if m.get("type") == _POOLING_MODULE)
        pooling_dir = directory / pooling_module.get("path", "1_Pooling")
        pooling_config = json.loads((pooling_dir / "config.json").read_text())
    except (OSError, ValueError, StopIteration, AttributeError, TypeError):
        return None
    others = sorted({str(m.get("type")) for m in modules} - _SERVED_MODULES)
    if others:
        raise TaskError(
            f"{directory / 'modules.json'} has {', '.join(others)}; an embedder is served as "
            "Transformer, Pooling and Normalize only"
        )
    normalize = any(m.get("type") == _NORMALIZE_MODULE for m in modules)
    if pooling_config.get("pooling_mode_lasttoken"):
        return "last", normalize
    if pooling_config.get("pooling_mode_mean_tokens"):
        return "mean", normalize
    modes = sorted(k for k, v in pooling_config.items() if k.startswith("pooling_mode") and v)
    raise TaskError(
        f"{pooling_dir / 'config.json'} asks for {', '.join(modes) or 'no pooling'}; "
        "served poolings: last token, mean"
    )


def task_for_model(requested: str, model: str, config: dict[str, Any]) -> ModelTask:
    """`resolve_task` for a `--model` string: its checkpoint directory is read where it has
    one (a local directory, or a Hub snapshot the loader fetched), and the name checked is
    the string itself (a Hub snapshot's directory is named by its commit)."""
    from radixserve.catalog.checkpoint_files import is_hf_directory, local_path
    from radixserve.server_args import BUILTIN_SMOLLM2, RANDOM_PREFIX

    directory = None
    if not model.startswith((RANDOM_PREFIX, BUILTIN_SMOLLM2)):
        path = local_path(model, cached_only=True)
        directory = path if is_hf_directory(path) else None
    return resolve_task(requested, config, directory, model)
