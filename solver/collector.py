"""Python's cyclic garbage collector, held back while a plan is solved.

A solve keeps hundreds of thousands of small tracked objects alive at once at 1,024 GPUs
(per-sample tuples, children, bins), and every 700 net allocations CPython's first generation
collection walks the young ones, every tenth of those the second generation: measured on the 20
1,024-GPU steps of ``repack bench`` in ``repack+sizing``, the collector took 1.40 s of the
~11 s (13%; 3,570 + 325 + 25 collections), 0.35 s with the imports frozen (``gc.freeze()``, as
the service's workers do), and nothing with the first generation's threshold at 100,000 during
each solve. The solver makes almost no reference cycles (its objects are freed by reference
counting when a stage ends), so raising the threshold for the solve's duration defers little
work: what is left is collected by the first collection after the solve.

Held back, not disabled: a solve that did make cycles would still have them collected, every
``SOLVE_THRESHOLD`` allocations. Nested and concurrent solves (threads) share one hold: the
first to enter raises the threshold, the last to leave restores the caller's setting.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

SOLVE_THRESHOLD = 100_000
"""First-generation threshold while a solve runs (CPython's default: 700)."""

_lock = threading.Lock()
_holders = 0
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def collector_held_back() -> Iterator[None]:
    """Raise the collector's first-generation threshold to ``SOLVE_THRESHOLD`` for the block
    (never lower it; a collector switched off stays off), restoring it when the last holder
    leaves."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = gc.get_threshold()
            first, *rest = _saved
            if first != 0:  # threshold 0: collection switched off by the caller
                gc.set_threshold(max(first, SOLVE_THRESHOLD), *rest)
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None
