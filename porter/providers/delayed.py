"""A provider that answers only after a fixed delay: a model that takes a minute to think,
without the model (benchmarks of `porter run --jobs N` and their tests).

    RunOptions(provider={"provider": "scripted", "answer_delay_s": 60})
"""

from __future__ import annotations

import time


class DelayedProvider:
    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s = inner, float(delay_s)

    def complete(self, req):
        time.sleep(self.delay_s)  # outside any lock: N units think at once
        return self.inner.complete(req)

    def describe(self) -> str:
        return f"{self.inner.describe()} (answers after {self.delay_s:g} s)"

    def __getattr__(self, name):
        return getattr(self.inner, name)
