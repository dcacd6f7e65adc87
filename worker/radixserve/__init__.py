"""radixserve: an LLM inference worker with continuous batching and a radix prefix cache."""

__version__ = "0.1.0"
