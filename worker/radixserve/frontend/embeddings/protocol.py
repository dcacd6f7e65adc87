"""Request shapes of the pooling endpoints, validated like the OpenAI ones (pydantic, strict;
every problem a 400 naming its field; unknown fields warned about or, with --strict-api,
refused: `openai.protocol.parse_request`):

- `POST /v1/embeddings`: OpenAI's: `input` (a string, a list of strings, a list of token ids, a
  list of lists of token ids), `encoding_format` (float or base64), `dimensions`; `user` ignored;
- `POST /v1/rerank`: the Cohere/Jina shape vLLM and SGLang accept: `query`, `documents`
  (strings, or objects with `text`), `top_n`, `return_documents`; `instruction` (an extension:
  the task line of an instruction-tuned reranker's prompt, Qwen3-Reranker's `<Instruct>`);
  `max_chunks_per_doc` and `rank_fields` ignored;
- `POST /v1/score`: vLLM's: `text_1` (one string, or one per `text_2`) scored against each of
  `text_2`.

The bounds (inputs per request, documents, dimensions) are checked here and by
`serving.py`; docs/api.md lists them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from radixserve.api_errors import InvalidParameterError
from radixserve.frontend.openai.protocol import _Request

# OpenAI's own limit on inputs per embeddings request
MAX_EMBEDDING_INPUTS = 2048
# documents (or text_2 entries) scored by one request
MAX_RERANK_DOCUMENTS = 1024


class EmbeddingRequest(_Request):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None  # ignored

    def check_supported(self) -> None:
        if isinstance(self.input, list):
            if not self.input:
                raise InvalidParameterError("input must not be an empty list", "input")
            if len(self.input) > MAX_EMBEDDING_INPUTS and not isinstance(self.input[0], int):
                raise InvalidParameterError(
                    f"input has {len(self.input)} entries; at most {MAX_EMBEDDING_INPUTS} per "
                    "request",
                    "input",
                )
        for index, item in enumerate(self.inputs()):
            if not item:
                where = "input" if isinstance(self.input, str) else f"input.{index}"
                raise InvalidParameterError(f"{where} is empty", where)

    def inputs(self) -> list[str | list[int]]:
        """The batch: one string, several strings, one or several token lists."""
        if isinstance(self.input, str):
            return [self.input]
        if all(isinstance(item, int) for item in self.input):
            return [list(self.input)]  # type: ignore[arg-type]
        return list(self.input)  # type: ignore[arg-type]


class RerankDocument(_Request):
    text: str


class RerankRequest(_Request):
    model: str | None = None
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = True
    instruction: str | None = None
    max_chunks_per_doc: Any = None  # ignored: documents are not split
    rank_fields: Any = None  # ignored: documents are text

    def check_supported(self) -> None:
        _check_texts(self.documents, "documents")
        if not self.query:
            raise InvalidParameterError("query is empty", "query")

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class ScoreRequest(_Request):
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]

    def check_supported(self) -> None:
        firsts, seconds = self.pairs_of()
        _check_texts(seconds, "text_2")
        if len(firsts) != 1 and len(firsts) != len(seconds):
            raise InvalidParameterError(
                f"text_1 has {len(firsts)} entries: give one, or one per text_2 entry "
                f"({len(seconds)})",
                "text_1",
            )
        for index, text in enumerate(firsts):
            if not text:
                where = "text_1" if isinstance(self.text_1, str) else f"text_1.{index}"
                raise InvalidParameterError(f"{where} is empty", where)

    def pairs_of(self) -> tuple[list[str], list[str]]:
        firsts = [self.text_1] if isinstance(self.text_1, str) else list(self.text_1)
        seconds = [self.text_2] if isinstance(self.text_2, str) else list(self.text_2)
        return firsts, seconds


def _check_texts(texts: list[Any], param: str) -> None:
    if not texts:
        raise InvalidParameterError(f"{param} must not be empty", param)
    if len(texts) > MAX_RERANK_DOCUMENTS:
        raise InvalidParameterError(
            f"{param} has {len(texts)} entries; at most {MAX_RERANK_DOCUMENTS} per request", param
        )
    for index, item in enumerate(texts):
        text = item if isinstance(item, str) else getattr(item, "text", "")
        if not text:
            raise InvalidParameterError(f"{param}.{index} is empty", f"{param}.{index}")
