"""The front end's tokenizer, loaded without torch.

transformers' `AutoTokenizer` imports torch (its auto classes pull in generation configs), and
the front end must stay torch-free: it loads the directory the scheduler process reports
(`model_loader.tokenizer.frontend_tokenizer_dir`: a `tokenizer.json` with its config and chat
template) with the Rust-backed `PreTrainedTokenizerFast`, which encodes, decodes and renders
chat templates the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_frontend_tokenizer(directory: str | None) -> PreTrainedTokenizerBase | None:
    """The tokenizer saved in `directory`, or None for a model driven by token ids only.
    transformers is imported here, once the scheduler reported ready, not with the engine: the
    model check before the spawn's approval runs without it."""
    if directory is None:
        return None
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(directory)
