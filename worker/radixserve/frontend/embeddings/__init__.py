"""The pooling endpoints of an embedding or reranking model (`--task embed|rerank`):
OpenAI's `POST /v1/embeddings`, the Cohere/Jina-shaped `POST /v1/rerank` and vLLM's
`POST /v1/score`, over the same front door and request type as generation."""
