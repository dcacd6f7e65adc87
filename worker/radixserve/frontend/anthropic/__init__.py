"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) over the
same front door, chat template, tool and reasoning parsers as the OpenAI endpoints."""
