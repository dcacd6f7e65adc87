"""A compile recipe for grammar-limit tests, in a module of its own: a compile worker process
imports it to unpickle the recipe, and should not import the tests' heavier modules."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# a constraint whose text holds this never finishes compiling
SLOW = "never-compiles"
# one whose text holds this compiles at once, and takes a second to serialize
SLOW_TO_SERIALIZE = "slow-to-serialize"


@dataclass(frozen=True)
class SlowRecipe:
    """`inner`'s compiles, but a constraint holding SLOW sleeps until its worker is killed, and
    one holding SLOW_TO_SERIALIZE takes a second to serialize."""

    inner: Any

    def build(self):
        compile_one = self.inner.build()

        def compile_slowly(kind: str, text: str):
            if SLOW in text:
                time.sleep(600)
            serialize, nbytes = compile_one(kind, text)
            if SLOW_TO_SERIALIZE in text:
                return (lambda: time.sleep(1.0) or serialize()), nbytes
            return serialize, nbytes

        return compile_slowly


@dataclass(frozen=True)
class BrokenRecipe:
    """A recipe whose worker cannot start."""

    def build(self):
        raise RuntimeError("no compiler here")
