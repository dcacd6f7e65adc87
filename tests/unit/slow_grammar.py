"""A compile recipe for grammar-limit tests, in a module of its own: a compile worker process
imports it to unpickle the recipe, and should not import the tests' heavier modules."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# a constraint whose text holds this never finishes compiling
SLOW = "never-compiles"


@dataclass(frozen=True)
class SlowRecipe:
    """`inner`'s compiles, but a constraint holding SLOW sleeps until its worker is killed."""

    inner: Any

    def build(self):
        compile_one = self.inner.build()

        def compile_slowly(kind: str, text: str):
            if SLOW in text:
                time.sleep(600)
            return compile_one(kind, text)

        return compile_slowly
