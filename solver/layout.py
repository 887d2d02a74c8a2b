"""Layouts (parents of children of samples) and their evaluation under the cost model.

A layout is what every planner produces; ``plan_builder`` turns one into the wire-format Plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from solver.cost_model import (
    CostModel,
    SampleCosts,
    inter_node_bytes,
    parent_seconds,
)


@dataclass(frozen=True)
class Child:
    """A node-local group of ``size`` ranks from ``start``; ``samples`` in packing order."""

    start: int
    size: int
    samples: tuple[int, ...]


@dataclass(frozen=True)
class Parent:
    """A full-attention group of ``size`` ranks from ``start``, tiled by its children."""

    start: int
    size: int
    children: tuple[Child, ...]

    @property
    def samples(self) -> tuple[int, ...]:
        """Packing order of the parent: its children's samples in rank order."""
        return tuple(s for c in self.children for s in c.samples)

    @property
    def repacked(self) -> bool:
        return not (len(self.children) == 1 and self.children[0].size == self.size)


Layout = tuple[Parent, ...]


def split_tokens(total: int, size: int) -> list[int]:
    """Tokens of each rank of a child: rank i owns ``[floor(i*T/k), floor((i+1)*T/k))``."""
    return [(i + 1) * total // size - i * total // size for i in range(size)]


def unrepacked(start: int, size: int, samples: Iterable[int]) -> Parent:
    """The baseline layout of a parent: one child spanning all its ranks."""
    return Parent(start, size, (Child(start, size, tuple(samples)),))


def parent_starts(sizes: Sequence[int]) -> list[int]:
    starts, at = [], 0
    for size in sizes:
        starts.append(at)
        at += size
    return starts


def baseline_layout(sizes: Sequence[int], members: Sequence[Sequence[int]]) -> Layout:
    return tuple(
        unrepacked(start, size, group)
        for start, size, group in zip(parent_starts(sizes), sizes, members, strict=True)
    )


def child_terms(child: Child, costs: SampleCosts) -> tuple[int, float, int]:
    """``(size, sparse_s, tokens)`` of a child, the cost model's input."""
    idx = list(child.samples)
    return child.size, float(costs.sparse_s[idx].sum()), int(costs.tokens[idx].sum())


def parent_time(parent: Parent, cost: CostModel, costs: SampleCosts) -> float:
    full_s = float(costs.full_s[list(parent.samples)].sum())
    terms = [child_terms(c, costs) for c in parent.children]
    return parent_seconds(cost, parent.size, full_s, terms)


@dataclass(frozen=True)
class LayoutEval:
    step_s: float
    parent_s: tuple[float, ...]
    inter_node_bytes: float
    imbalance: float
    """Step time over the rank-weighted mean parent time, minus one (0 = perfectly even)."""


def evaluate(layout: Layout, cost: CostModel, costs: SampleCosts) -> LayoutEval:
    times: list[float] = []
    inter = 0.0
    for p in layout:
        terms = [child_terms(c, costs) for c in p.children]  # once per child, not three times
        full_s = float(costs.full_s[list(p.samples)].sum())
        times.append(parent_seconds(cost, p.size, full_s, terms))
        ranks = [n for k, _, tokens in terms for n in split_tokens(tokens, k)]
        inter += cost.full_layers * inter_node_bytes(cost, p.size, ranks)
        for k, _, tokens in terms:  # only an unrepacked parent wider than a node crosses nodes
            child_ranks = split_tokens(tokens, k)
            inter += cost.sparse_layers * inter_node_bytes(cost, k, child_ranks)
    step = max(times)
    mean = sum(t * p.size for t, p in zip(times, layout, strict=True)) / cost.world_size
    return LayoutEval(
        step_s=step,
        parent_s=tuple(times),
        inter_node_bytes=inter,
        imbalance=step / mean - 1.0 if mean > 0 else 0.0,
    )
