"""The budget of one solve: the wall-clock safety net and whether CP-SAT may run."""

from __future__ import annotations

import time


class Budget:
    """Wall-clock budget, checked between deterministic steps, never inside one, so that a
    solve that finishes in time is the same on every machine. ``use_cpsat=False`` keeps the
    greedy stages only (what ``repack bench`` times as "greedy")."""

    def __init__(self, ms: float, use_cpsat: bool = True) -> None:
        self.end = time.perf_counter() + ms / 1e3
        self.fired = False
        self.use_cpsat = use_cpsat

    def remaining_s(self) -> float:
        return self.end - time.perf_counter()

    def expired(self) -> bool:
        if self.remaining_s() <= 0:
            self.fired = True
        return self.fired
