"""Hugging Face Hub repositories as `--model` (`org/name` or `hf://org/name`, what the operator
passes for an InferenceService's `hf://` model) and as LoRA adapters (`hf://org/name@revision`:
a branch, tag or commit; the default branch without one).

The checkpoint is fetched into HF_HOME once (on Kubernetes that is the service's model-cache
volume, so a restart or a second replica reuses it) and loaded as a Hugging Face directory.
With HF_HUB_OFFLINE=1, or when the Hub cannot be reached, only the cache is used.
"""

from __future__ import annotations

import re
from pathlib import Path

HUB_REPO = re.compile(
    r"^(?:hf://)?(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w.-]+))?$"
)
# what serving needs: configs, safetensors weights, tokenizer files, chat templates
HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


def resolve_hub_model(model: str, cached_only: bool = False) -> Path | None:
    """The local snapshot directory of a Hub repository id, or None if `model` is not one (an
    existing local path always wins over a repository of the same name). `cached_only`: never
    reach the Hub, and None when the repository is not in the cache."""
    match = HUB_REPO.match(model)
    if match is None or (not model.startswith("hf://") and Path(model).expanduser().exists()):
        return None
    from huggingface_hub import snapshot_download

    repo = match["repo"]
    try:
        snapshot = snapshot_download(
            repo,
            revision=match["revision"],
            allow_patterns=HUB_FILES,
            local_files_only=cached_only,
        )
        return Path(snapshot)
    except Exception as exc:
        if cached_only:
            return None  # offline with an empty cache, gated repo, unknown repo, ...
        raise ValueError(
            f"cannot get {repo!r} from the Hugging Face Hub or its cache "
            f"({type(exc).__name__}: {exc}); mount the checkpoint as a directory or fill HF_HOME"
        ) from exc
