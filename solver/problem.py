"""The solver's internal view of a request: per-sample costs as plain floats, parents sized."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from solver.cost_model import CostModel, SampleCosts
from solver.schema import CHILD_SIZES, PlanRequest


@dataclass(frozen=True)
class Problem:
    """Everything a planner needs, precomputed once per request."""

    cost: CostModel
    costs: SampleCosts
    tokens: tuple[int, ...]
    full_s: tuple[float, ...]
    sparse_s: tuple[float, ...]

    @classmethod
    def from_request(cls, request: PlanRequest) -> Problem:
        cost = CostModel.from_request(request)
        costs = SampleCosts.build(cost, request.lengths)
        return cls(
            cost=cost,
            costs=costs,
            tokens=tuple(request.lengths),
            full_s=tuple(costs.full_s.tolist()),
            sparse_s=tuple(costs.sparse_s.tolist()),
        )

    @property
    def num_samples(self) -> int:
        return len(self.tokens)

    @cached_property
    def child_sizes(self) -> tuple[int, ...]:
        return tuple(k for k in CHILD_SIZES if k <= self.cost.gpus_per_node)

    @cached_property
    def work_s(self) -> tuple[float, ...]:
        """Sparse-layer rank-seconds of each sample with no communication (a child of 1)."""
        lin = self.cost.linear_seconds_per_token
        return tuple(s + t * lin for s, t in zip(self.sparse_s, self.tokens, strict=True))

    @cached_property
    def alone_s(self) -> dict[int, tuple[float, ...]]:
        """Per child size: each sample's sparse-layer time alone in a child of that size, what
        the child packer tests before opening a child. ``child_layer_seconds`` vectorised: the
        same float operations in the same order, so the same bits."""
        cost = self.cost
        tokens = np.asarray(self.tokens, dtype=np.int64)
        sparse = np.asarray(self.sparse_s, dtype=np.float64)
        table = {}
        for k in self.child_sizes:
            per_token = cost.linear_seconds_per_token + cost.a2a_seconds_per_token(k)
            t = sparse / k + -(-tokens // k) * per_token + cost.layer_fixed_seconds(k)
            table[k] = tuple(np.where(tokens == 0, 0.0, t).tolist())
        return table

    @cached_property
    def heavy_rank(self) -> tuple[int, ...]:
        """Position of each sample in decreasing-work order (index breaks ties): a sort key
        that costs no Python call per comparison."""
        order = sorted(range(self.num_samples), key=lambda s: (-self.work_s[s], s))
        rank = [0] * self.num_samples
        for position, s in enumerate(order):
            rank[s] = position
        return tuple(rank)

    @cached_property
    def light_rank(self) -> tuple[int, ...]:
        """Position of each sample in increasing-work order (index breaks ties): not the
        reverse of ``heavy_rank``, whose ties go the other way."""
        order = sorted(range(self.num_samples), key=lambda s: (self.work_s[s], s))
        rank = [0] * self.num_samples
        for position, s in enumerate(order):
            rank[s] = position
        return tuple(rank)

    @cached_property
    def fill(self) -> float:
        """Share of the cluster's token memory the step holds (a packing loader's ~0.99)."""
        return sum(self.tokens) / self.capacity(self.cost.world_size)

    def capacity(self, size: int) -> int:
        return size * self.cost.max_tokens_per_rank

    def single_bounds(self, size: int) -> tuple[float, ...]:
        """Per sample: least sparse-layer time alone in a node-local child of a parent of
        ``size`` ranks; ``inf`` where no child can hold it (that parent stays unrepacked)."""
        cache = self._bound_cache
        if size not in cache:
            cache[size] = tuple(t for t, _ in self.single_choices(size))
        return cache[size]

    @cached_property
    def _bound_cache(self) -> dict[int, tuple[float, ...]]:
        return {}

    @cached_property
    def memo(self) -> dict[tuple[object, ...], float]:
        """Results of pure functions of this problem, keyed by (function name, arguments)."""
        return {}

    @cached_property
    def packings(self) -> dict[tuple[object, ...], object]:
        """Node-local child packings by their arguments (``node_packing.packed_children``):
        several stages of one request pack the same segments."""
        return {}

    def single_choices(self, size: int) -> tuple[tuple[float, int], ...]:
        """Per sample: ``(time, tokens on its busiest rank)`` in the child that
        ``single_bounds`` picks (``(inf, 0)`` if none). Memoised per size: every planner stage
        asks for the same few sizes."""
        cache = self._single_cache
        if size not in cache:
            cache[size] = self._singles(size)
        return cache[size]

    @cached_property
    def _single_cache(self) -> dict[int, tuple[tuple[float, int], ...]]:
        return {}

    def _singles(self, size: int) -> tuple[tuple[float, int], ...]:
        """``single_choices`` for every sample at once: the least ``(time, busiest-rank
        tokens)`` over the child sizes that hold it. Vectorised (at 6,000 samples the
        per-sample loop cost ~20 ms per size); the same float operations in the same order as
        ``child_layer_seconds``, so the same bits."""
        cost = self.cost
        tokens = np.asarray(self.tokens, dtype=np.int64)
        sparse = np.asarray(self.sparse_s, dtype=np.float64)
        best_t = np.full(len(tokens), math.inf)
        best_n = np.zeros(len(tokens), dtype=np.int64)
        for k in self.child_sizes:
            if k > size:
                continue
            n = -(-tokens // k)
            per_token = cost.linear_seconds_per_token + cost.a2a_seconds_per_token(k)
            t = sparse / k + n * per_token + cost.layer_fixed_seconds(k)
            t = np.where(tokens == 0, 0.0, t)  # an empty child costs nothing
            better = (tokens <= self.capacity(k)) & ((t < best_t) | ((t == best_t) & (n < best_n)))
            best_t = np.where(better, t, best_t)
            best_n = np.where(better, n, best_n)
        return tuple(zip(best_t.tolist(), best_n.tolist(), strict=True))
