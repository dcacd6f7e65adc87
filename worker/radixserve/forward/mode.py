"""`ForwardMode`: what kind of pass a batch is, read by every layer from the scheduler down."""

from __future__ import annotations

from enum import IntEnum, auto


class ForwardMode(IntEnum):
    EXTEND = auto()  # prefill, with or without a cached prefix
    DECODE = auto()  # one new token per request
    MIXED = auto()  # chunked prefill and decode requests in one extend-shaped pass
    IDLE = auto()  # nothing to run (kept so every rank steps together under TP)
    # speculative decoding: each request's last token and its proposed ones, scored in one
    # pass (the scheduler's mode: it reaches the worker as a decode pass of one row per
    # position, ModelWorkerBatch.verify_draft_lens; acceptance in speculative/verify.py)
    VERIFY = auto()

    def is_extend(self) -> bool:
        """Extend-shaped attention: EXTEND, and MIXED whose decode rows are length-1 extends."""
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_mixed(self) -> bool:
        return self == ForwardMode.MIXED

    def is_verify(self) -> bool:
        return self == ForwardMode.VERIFY

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE

    @property
    def metric_label(self) -> str:
        return {
            ForwardMode.EXTEND: "prefill",
            ForwardMode.DECODE: "decode",
            ForwardMode.VERIFY: "verify",
        }.get(self, "mixed")
