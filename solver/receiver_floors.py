"""Lower bounds of every receiving bin's parent time with one more sample, all bins at once.

The node stage's moves (``node_membership``) try one sample on each receiving bin in turn, and
most receivers are ruled out by ``NodeSeed._time_floor`` before any child is edited. On a
1,024-GPU step (~6,000 samples, 128 receivers per move) those one-at-a-time floors were most
of the stage's time. The floor is the same arithmetic for every receiver, so it is computed
here for all of them in one numpy pass per sample, from terms taken once per move; the move
phase then skips the receivers whose floor is clearly above its target and checks the others
exactly, as before. A prefilter only: the plan does not change.

From ``EDIT_SCREEN_RECEIVERS`` receivers on, the same pass also computes, for the receivers
whose trial is an edit of packed children that re-packs nothing (``EditTerms``), the trial's
parent time itself (the floor's arithmetic with the bin's slowest child and busiest rank after
the sample joins its fastest child with room): a receiver whose floor lets it through but whose
edit is too slow is skipped at the edit's work charge, so the budget, the moves and the plan
stay the same. On 1,024-GPU bench steps the floor (a bin's average work) let ~11,000 such
trials through per step where the move phase spent its whole budget.

The terms are taken when a move starts. While the move's receivers are tried, a bin can only
become packed (fresh), never lose its children, so a sibling's children left out here can
only make these floors lower than ``_time_floor``'s: the filter stays safe.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from solver.cost_model import CostModel

SLACK = 1e-9
"""Relative margin of a skip: the exact floor sums the bins in another order (float noise)."""


@dataclass(frozen=True)
class EditRow:
    """One receiving bin's packed children, as its trial edit reads them."""

    sizes: list[int]
    sparse: list[float]
    tokens: list[int]
    z: float
    """Slowest child layer and busiest rank's tokens (``NodeSeed._edited``'s arithmetic)."""
    m: int
    charge: int
    """Work the edit is charged."""


@dataclass(frozen=True)
class EditTerms:
    """The receivers whose trial is an edit of packed children (``NodeSeed._edited``): not
    whole, their bin and every sibling packed (so the trial re-packs nothing), the bin with
    children. For them the trial's parent time is the floor's arithmetic with the bin's
    slowest child and busiest rank after ``s`` joins its fastest child with room, computed
    here for all of them at once."""

    valid: NDArray[np.bool_]
    """Per receiver: the trial is such an edit."""
    z: NDArray[np.float64]
    """Per receiver: the bin's slowest child layer and busiest rank's tokens, before ``s``."""
    m: NDArray[np.int64]
    charge: list[int]
    """Per receiver: the work the trial's edit is charged (``EDIT_WORK`` per child, plus one)."""
    owner: NDArray[np.int64]
    """Per child of a valid receiver, in receiver order: the receiver, size, sparse seconds,
    tokens; ``starts``: each valid receiver's first child."""
    size: NDArray[np.int64]
    sparse: NDArray[np.float64]
    tokens: NDArray[np.int64]
    starts: NDArray[np.int64]
    per_token: NDArray[np.float64]
    fixed: NDArray[np.float64]


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
    edits: EditTerms | None = None

    @classmethod
    def build(
        cls,
        cost: CostModel,
        rows: Sequence[tuple[int, int, float, int, float, float, int, float, int, bool]],
        edits: Sequence[EditRow | None] = (),
    ) -> ReceiverTerms:
        """``rows``: per bin (size, ranks, full, tokens, sparse, work, bin tokens, z, m,
        whole_only); ``edits``: per bin, its children ``(size, sparse seconds, tokens)`` and
        the trial edit's charge where the trial is such an edit (``EditTerms``)."""
        cols = list(zip(*rows, strict=True))
        size = np.asarray(cols[0], dtype=np.int64)
        per, fix = _group_tables(cost, size)
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
            per_token=per,
            fixed=fix,
            edits=_edit_terms(cost, edits) if any(e is not None for e in edits) else None,
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

    def screen(
        self,
        cost: CostModel,
        target: float,
        sample: tuple[float, int, float, float],
    ) -> tuple[list[bool], list[bool]]:
        """Per receiver: its floor with ``sample`` is clearly above ``target`` (ruled out
        for free, as ``_floor_with`` would), and, failing that, its trial edit is (ruled out
        at the edit's charge: the floor is clearly below ``target`` and the parent has the
        memory, so the exact path would have tried the edit and found it too slow)."""
        full_s, tokens, sparse_s, _ = sample
        floors = self.floors_with(cost, *sample)
        plain = floors > target * (1 + SLACK)
        e = self.edits
        if e is None or not e.valid.any():
            return plain.tolist(), [False] * len(plain)
        tok = e.tokens + tokens
        room = tok <= e.size * cost.max_tokens_per_rank
        t = (e.sparse + sparse_s) / e.size + -(-tok // e.size) * e.per_token + e.fixed
        t = np.where(room, t, np.inf)
        busiest = np.where(room, -(-tok // e.size), np.iinfo(np.int64).max)
        best = np.full(len(plain), np.inf)
        busiest_best = np.zeros(len(plain), dtype=np.int64)
        rows = e.owner[e.starts]
        best[rows] = np.minimum.reduceat(t, e.starts)
        busiest_best[rows] = np.minimum.reduceat(busiest, e.starts)
        total = self.tokens + tokens
        spread = -(-total // self.size)
        base = (self.full + full_s) / self.size
        whole = cost.full_layers * (base + spread * self.per_token + self.fixed)
        whole = whole + cost.sparse_layers * (
            (self.sparse + sparse_s) / self.size + spread * self.per_token + self.fixed
        )
        m = np.maximum(np.maximum(e.m, busiest_best), self.m)
        z = np.maximum(np.maximum(e.z, best), self.z)
        # 0 x inf is NaN: a model without sparse layers (pattern "F") has no child term at all
        sparse = cost.sparse_layers * z if cost.sparse_layers else 0.0
        split = cost.full_layers * (base + m * self.per_token + self.fixed) + sparse
        edited = np.minimum(whole, split)
        fits = total <= self.size * cost.max_tokens_per_rank
        out = (
            e.valid
            & np.isfinite(best)
            & fits
            & ~plain
            & (floors < target * (1 - SLACK))
            & (edited > target * (1 + SLACK))
        )
        return plain.tolist(), out.tolist()


def _edit_terms(cost: CostModel, edits: Sequence[EditRow | None]) -> EditTerms:
    owner: list[int] = []
    size: list[int] = []
    sparse: list[float] = []
    tokens: list[int] = []
    starts: list[int] = []
    for i, edit in enumerate(edits):
        if edit is not None:
            starts.append(len(owner))
            owner += [i] * len(edit.sizes)
            size += edit.sizes
            sparse += edit.sparse
            tokens += edit.tokens
    sizes = np.asarray(size, dtype=np.int64)
    per, fix = _group_tables(cost, sizes)
    return EditTerms(
        valid=np.asarray([e is not None for e in edits], dtype=np.bool_),
        z=np.asarray([0.0 if e is None else e.z for e in edits], dtype=np.float64),
        m=np.asarray([0 if e is None else e.m for e in edits], dtype=np.int64),
        charge=[0 if e is None else e.charge for e in edits],
        owner=np.asarray(owner, dtype=np.int64),
        size=sizes,
        sparse=np.asarray(sparse, dtype=np.float64),
        tokens=np.asarray(tokens, dtype=np.int64),
        starts=np.asarray(starts, dtype=np.int64),
        per_token=per,
        fixed=fix,
    )


def _group_tables(
    cost: CostModel, sizes: NDArray[np.int64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``token_seconds`` and ``layer_fixed_seconds`` of each group size in ``sizes``, read from
    a table of every group size of the cluster (the same floats as calling them per element)."""
    per, fix = _size_tables(cost)
    return per[sizes], fix[sizes]


@functools.lru_cache(maxsize=16)
def _size_tables(cost: CostModel) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per group size ``0..world_size`` (0 unused): built once per cost model, i.e. request."""
    sizes = range(1, cost.world_size + 1)
    per = np.asarray([0.0, *(cost.token_seconds(k) for k in sizes)], dtype=np.float64)
    fix = np.asarray([0.0, *(cost.layer_fixed_seconds(k) for k in sizes)], dtype=np.float64)
    return per, fix
