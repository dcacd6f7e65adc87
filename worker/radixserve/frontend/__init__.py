"""The front-end process: HTTP, the OpenAI protocol and its parsers, the tokenizer manager and
the detokenizer, the request log, and the `Engine` that starts the scheduler process. It never
imports torch (`.importlinter`, `tests/unit/test_architecture.py`): it stays light, and its
event loop answers probes while the scheduler process owns the GPU."""
