"""The wall-clock safety net of a solve."""

from __future__ import annotations

import time


class Deadline:
    """Wall-clock budget; checked between deterministic steps, never inside one, so that a
    solve that finishes in time is the same on every machine."""

    def __init__(self, ms: float) -> None:
        self.end = time.perf_counter() + ms / 1e3
        self.fired = False

    def remaining_s(self) -> float:
        return self.end - time.perf_counter()

    def expired(self) -> bool:
        if self.remaining_s() <= 0:
            self.fired = True
        return self.fired
