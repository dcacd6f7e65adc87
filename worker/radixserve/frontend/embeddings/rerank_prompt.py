"""The prompt of a reranker scored by its "yes" and "no" tokens (Qwen3-Reranker): the
instruction template of its model card, which vLLM's examples and SGLang apply the same way.
The model reads a system line, the instruction, the query and the document, and its answer's
first token is scored: sigmoid(logit("yes") - logit("no")).

The prompt comes in two parts, split before the document, so that every document of one
query shares the first part's tokens (the radix cache computes them once).
"""

from __future__ import annotations

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
_SYSTEM = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
_ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def yes_no_prompt(query: str, document: str, instruction: str | None) -> tuple[str, str]:
    """(the query's part, the document's part) of one pair's prompt."""
    head = f"{_SYSTEM}<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n"
    return head, f"<Document>: {document}{_ASSISTANT}"
