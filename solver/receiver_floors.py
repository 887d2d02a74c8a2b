"""Lower bounds of every receiving bin's parent time with one more sample, all bins at once.

The node stage's moves (``node_membership``) try one sample on each receiving bin in turn, and
most receivers are ruled out by ``NodeSeed._time_floor`` before any child is edited. On a
1,024-GPU step (~6,000 samples, 128 receivers per move) those one-at-a-time floors were most
of the stage's time. The floor is the same arithmetic for every receiver, so it is computed
here for all of them in one numpy pass per sample, from terms taken once per move; the move
phase then skips the receivers whose floor is clearly above its target and checks the others
exactly, as before. A prefilter only: the plan does not change.

The terms are taken when a move starts. While the move's receivers are tried, a bin can only
become packed (fresh), never lose its children, so a sibling's children left out here can
only make these floors lower than ``_time_floor``'s: the filter stays safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from solver.cost_model import CostModel

SLACK = 1e-9
"""Relative margin of a skip: the exact floor sums the bins in another order (float noise)."""


@dataclass(frozen=True)
class ReceiverTerms:
    """Per receiving bin: what ``_time_floor`` of its parent reads, before the new sample."""

    size: NDArray[np.int64]
    """Ranks of the bin's parent."""
    ranks: NDArray[np.int64]
    """Ranks of the bin."""
    full: NDArray[np.float64]
    """The parent's full-attention seconds, tokens and sparse seconds (all its bins)."""
    tokens: NDArray[np.int64]
    sparse: NDArray[np.float64]
    work: NDArray[np.float64]
    """The bin's sparse-layer rank-seconds and tokens."""
    bin_tokens: NDArray[np.int64]
    z: NDArray[np.float64]
    """The parent's other packed bins: slowest child layer and busiest rank's tokens (0)."""
    m: NDArray[np.int64]
    whole_only: NDArray[np.bool_]
    """The floor is the unrepacked time: parent whole, of one rank, or a sibling packed into
    no children."""
    per_token: NDArray[np.float64]
    """Per token seconds and fixed seconds of one layer in a group of the parent's size."""
    fixed: NDArray[np.float64]

    @classmethod
    def build(
        cls,
        cost: CostModel,
        rows: Sequence[tuple[int, int, float, int, float, float, int, float, int, bool]],
    ) -> ReceiverTerms:
        """``rows``: per bin (size, ranks, full, tokens, sparse, work, bin tokens, z, m,
        whole_only)."""
        cols = list(zip(*rows, strict=True))
        size = np.asarray(cols[0], dtype=np.int64)
        sizes = sorted(set(cols[0]))
        per = {k: cost.token_seconds(k) for k in sizes}
        fix = {k: cost.layer_fixed_seconds(k) for k in sizes}
        return cls(
            size=size,
            ranks=np.asarray(cols[1], dtype=np.int64),
            full=np.asarray(cols[2], dtype=np.float64),
            tokens=np.asarray(cols[3], dtype=np.int64),
            sparse=np.asarray(cols[4], dtype=np.float64),
            work=np.asarray(cols[5], dtype=np.float64),
            bin_tokens=np.asarray(cols[6], dtype=np.int64),
            z=np.asarray(cols[7], dtype=np.float64),
            m=np.asarray(cols[8], dtype=np.int64),
            whole_only=np.asarray(cols[9], dtype=np.bool_),
            per_token=np.asarray([per[k] for k in cols[0]], dtype=np.float64),
            fixed=np.asarray([fix[k] for k in cols[0]], dtype=np.float64),
        )

    def floors_with(
        self, cost: CostModel, full_s: float, tokens: int, sparse_s: float, work_s: float
    ) -> NDArray[np.float64]:
        """Each receiver's parent floor with one sample of these costs added to the bin."""
        full = self.full + full_s
        total = self.tokens + tokens
        spread = -(-total // self.size)
        base = full / self.size
        whole = cost.full_layers * (base + spread * self.per_token + self.fixed)
        whole = whole + cost.sparse_layers * (
            (self.sparse + sparse_s) / self.size + spread * self.per_token + self.fixed
        )
        m = np.maximum(np.maximum(spread, -(-(self.bin_tokens + tokens) // self.ranks)), self.m)
        z = np.maximum((self.work + work_s) / self.ranks, self.z)
        split = cost.full_layers * (base + m * self.per_token + self.fixed)
        split = split + cost.sparse_layers * z
        return np.where(self.whole_only, whole, np.minimum(whole, split))

    def clearly_above(
        self,
        cost: CostModel,
        target: float,
        sample: tuple[float, int, float, float],
    ) -> list[bool]:
        """Per receiver: whether its floor with ``sample`` (full, tokens, sparse, work
        seconds) is above ``target`` by more than float noise."""
        floors = self.floors_with(cost, *sample)
        return (floors > target * (1 + SLACK)).tolist()
