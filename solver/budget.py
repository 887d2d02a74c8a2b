"""The budget of one solve: deterministic work limits, and the wall-clock safety net.

Two budgets, kept apart so that a plan depends only on its request:

* **work** (deterministic): how much search a solve may do, in machine-independent units:
  CP-SAT deterministic seconds (``cpsat_seconds``) and local-search evaluations (``evals``).
  It is a function of the request's own ``deadline_ms`` (``work_scale``), never of the clock:
  the same request gets the same search, hence the same plan, on a quiet laptop, a loaded
  service worker or a rank's local fallback. A shorter requested deadline buys less search
  (``repack bench --deadlines`` shows what that costs in quality).
* **wall clock** (safety net): ``expired()`` is checked between deterministic steps, never
  inside one, and CP-SAT gets the remaining wall time as its hard limit. It only fires when
  the machine is far slower than the work budget assumes; the plan is then still valid, but
  machine-dependent, and its ``stopped_by`` says ``deadline``.
"""

from __future__ import annotations

import math
import time

DEFAULT_DEADLINE_MS = 1000
"""The deadline of a request that gives none; its work budget is the planner's full one."""

MIN_WORK_SCALE = 0.02
"""Floor of ``work_scale``: even a 1 ms deadline gets a few evaluations and CP-SAT steps."""


def work_scale(deadline_ms: float) -> float:
    """Share of the full work budget a request with ``deadline_ms`` gets: proportional to its
    deadline up to the default one (whose budget leaves ~5x headroom on a quiet 2-core machine
    at 64 GPUs), capped at 1 so that p99 latency targets hold for any deadline."""
    return min(1.0, max(MIN_WORK_SCALE, deadline_ms / DEFAULT_DEADLINE_MS))


class WorkPool:
    """Work shared by several runs of the same stages within one step of a solve: each stage
    (by name) may spend ``calls`` times its own per-run limit in all. A run gets the smaller
    of its limit and what is left (``cap``) and reports what it used (``charge``); where the
    runs end early, as on small requests, the pool never binds and every run is as before."""

    def __init__(self, calls: float) -> None:
        self.calls = calls
        self._spent: dict[str, int] = {}

    def cap(self, name: str, limit: int) -> int:
        return min(limit, max(0, math.floor(limit * self.calls) - self._spent.get(name, 0)))

    def charge(self, name: str, work: int) -> None:
        self._spent[name] = self._spent.get(name, 0) + work

    def spent(self, name: str) -> int:
        return self._spent.get(name, 0)


class Budget:
    """Deterministic work limits plus the wall-clock safety net of one solve.

    ``use_cpsat=False`` keeps the greedy stages only (what ``repack bench`` times as "greedy").
    Stages ask ``cpsat_seconds(base)`` / ``evals(base)`` for their deterministic limits and
    check ``expired()`` between steps; a stage cut short by the clock sets ``fired``.
    """

    def __init__(self, ms: float, use_cpsat: bool = True, *, scale: float = 1.0) -> None:
        self.end = time.perf_counter() + ms / 1e3
        self.fired = False
        self.use_cpsat = use_cpsat
        self.scale = scale

    def cpsat_seconds(self, base_s: float) -> float:
        """CP-SAT deterministic time for a solve whose full-budget limit is ``base_s``."""
        return base_s * self.scale

    def evals(self, base: int) -> int:
        """Local-search evaluations for a search whose full-budget limit is ``base`` (at least
        one unless ``base`` is 0)."""
        return min(base, max(1, math.ceil(base * self.scale)))

    def move_evals(self, base: int) -> int:
        """``evals`` for the cheap local stages that buy the most step time per CPU second (the
        node stage's moves, the child swaps): ``sqrt`` of the scale instead of the scale. A
        short deadline's time goes mostly to work that does not shrink with the budget
        (set-up, upstream membership, bounds, the children, the plan's assembly); measured at
        64 GPUs, 50 ms: these stages at 22% of their limit instead of 5%, and CP-SAT polish
        skipped (``MIN_POLISH_SECONDS``), took `repack+parent` from +1.37% to +0.68% of the
        1 s result at less CPU. The same as ``evals`` at the full budget."""
        return min(base, max(1, math.ceil(base * math.sqrt(self.scale))))

    def remaining_s(self) -> float:
        return self.end - time.perf_counter()

    def expired(self) -> bool:
        if self.remaining_s() <= 0:
            self.fired = True
        return self.fired
