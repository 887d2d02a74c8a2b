"""CP-SAT model of one parent's child layout: which slots (children) each node uses and which
samples go where, minimising the parent's step time.

Formulation (linear, no products): every node of the parent offers a fixed menu of slots,
``g/k`` slots of each child size ``k``; a usage boolean per slot with ``sum k * used <= g``
keeps the chosen children a buddy-alignable partition of the node (sizes sorted largest first
are always aligned). ``x[i, slot]`` exists only where sample ``i`` fits the slot's memory and
could beat the incumbent. Times are integers of ``time_unit_s`` (1 ns unless the parent's
horizon would overflow, see cpsat_units.py); coefficients are rounded down
and ``ceil(T/k)`` is relaxed to ``T/k`` in child times, so the model never overestimates and
its bound is a true lower bound of the cost model. Symmetric slots and nodes are ordered by
load, and the greedy hint is relabelled to respect that order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from solver.cpsat_model import LeanCpModel
from solver.cpsat_units import time_unit_s
from solver.layout import Child, Parent
from solver.problem import Problem

DETERMINISTIC_SECONDS = 0.015

WORK_LIMIT_REACHED = 0.999
"""Share of the deterministic limit below which an unfinished search counts as cut by time."""
"""CP-SAT's deterministic work limit per parent (machine-independent, so results repeat)."""


def slot_count(problem: Problem, size: int) -> int:
    """Slots the model offers for a parent of ``size`` ranks (its menu on every node)."""
    g = min(size, problem.cost.gpus_per_node)
    return (size // g) * sum(g // k for k in problem.child_sizes if k <= g)


@dataclass(frozen=True)
class _Slot:
    node: int
    size: int
    index: int
    start_offset: int  # rank offset of the node segment inside the parent


@dataclass(frozen=True)
class ChildModelResult:
    parent: Parent | None
    """Best layout CP-SAT found (None if it found none, e.g. the hint was not completed)."""
    lower_bound_s: float
    """True lower bound of any repacked layout of this parent."""
    optimal: bool
    stopped_by_time: bool
    objective_s: float | None = None
    """The model's objective of ``parent`` plus the full-attention constant (relaxed time)."""


class ChildModel:
    """One parent's repacked layout as a CP-SAT model."""

    def __init__(
        self,
        problem: Problem,
        start: int,
        size: int,
        members: Sequence[int],
        incumbent_s: float,
    ) -> None:
        self.p = problem
        self.start, self.size = start, size
        self.members = list(members)
        cost = problem.cost
        self.g = min(size, cost.gpus_per_node)
        self.nodes = size // self.g
        self.sizes = [k for k in problem.child_sizes if k <= self.g]
        full_s = sum(problem.full_s[s] for s in members)
        # (the per-collective latency of the children is left out: the bound stays a bound)
        self.full_const_s = (
            cost.full_layers * full_s / size + cost.full_layers * cost.layer_fixed_seconds(size)
        )
        self.full_per_token_s = cost.full_layers * (
            cost.linear_seconds_per_token + cost.a2a_seconds_per_token(size)
        )
        self.unit_s = time_unit_s(self._horizon_s())
        self.incumbent = incumbent_s
        self.model = LeanCpModel()
        self.slots = [
            _Slot(n, k, q, n * self.g)
            for n in range(self.nodes)
            for k in self.sizes
            for q in range(self.g // k)
        ]
        self._variables()
        self._constraints()
        self._symmetry()
        self._objective()

    # --- coefficients -------------------------------------------------------------------
    def _horizon_s(self) -> float:
        """Every member in the slowest child size plus the busiest rank's full-layer term at
        full memory: no expression of the model sums to more (in seconds)."""
        cost, p = self.p.cost, self.p
        per_token = cost.linear_seconds_per_token + max(
            cost.a2a_seconds_per_token(k) for k in self.sizes
        )
        sparse = sum(p.sparse_s[i] + p.tokens[i] * per_token for i in self.members)
        return sparse + self.full_per_token_s * cost.max_tokens_per_rank

    def child_units(self, sample: int, k: int) -> int:
        """Floor of the sample's share of a size-k child's sparse-layer time, in units."""
        cost, p = self.p.cost, self.p
        per_token = cost.linear_seconds_per_token + cost.a2a_seconds_per_token(k)
        seconds = (p.sparse_s[sample] + p.tokens[sample] * per_token) / k
        return math.floor(seconds / self.unit_s)

    # --- model --------------------------------------------------------------------------
    def _variables(self) -> None:
        """Slot usage, sample-to-slot booleans where memory and the incumbent allow, M and Z."""
        m, p, cost = self.model, self.p, self.p.cost
        self.used = [m.new_bool_var(f"used_n{s.node}_k{s.size}_q{s.index}") for s in self.slots]
        budget_units = (self.incumbent - self.full_const_s) / max(cost.sparse_layers, 1)
        self.x: dict[tuple[int, int], cp_model.IntVar] = {}
        for i in self.members:
            for j, slot in enumerate(self.slots):
                if p.tokens[i] > slot.size * cost.max_tokens_per_rank:
                    continue
                if self.child_units(i, slot.size) * self.unit_s > budget_units:
                    continue  # alone there it already loses to the incumbent
                self.x[i, j] = m.new_bool_var(f"x_s{i}_n{slot.node}_k{slot.size}_q{slot.index}")
        # Redundant lower bounds (the LP relaxation is useless without them): some rank holds
        # the average and the longest member's share of a node-sized child; the slowest child
        # is no faster than any member alone, nor than all work spread on every rank.
        cap = cost.max_tokens_per_rank
        tokens = [p.tokens[i] for i in self.members]
        m_lo = max(-(-sum(tokens) // self.size), -(-max(tokens) // self.g))
        self.max_tokens = m.new_int_var(min(m_lo, cap), cap, "max_rank_tokens")
        work = sum(math.floor(p.work_s[i] / self.unit_s) for i in self.members)
        single = max(min(self.child_units(i, k) for k in self.sizes) for i in self.members)
        horizon = sum(max(self.child_units(i, k) for k in self.sizes) for i in self.members) + 1
        z_lo = max(single, work // self.size)
        self.z = m.new_int_var(min(z_lo, horizon), horizon, "max_child_time")

    def _constraints(self) -> None:
        """Each sample in one slot; node ranks; slot memory, time and busiest-rank tokens."""
        m, p = self.model, self.p
        by_slot: list[list[tuple[int, cp_model.IntVar]]] = [[] for _ in self.slots]
        by_sample: dict[int, list[cp_model.IntVar]] = {i: [] for i in self.members}
        for (i, j), var in self.x.items():
            by_slot[j].append((i, var))
            by_sample[i].append(var)
        for vars_ in by_sample.values():
            m.add_exactly_one(vars_)
        for n in range(self.nodes):
            m.add(
                sum(s.size * self.used[j] for j, s in enumerate(self.slots) if s.node == n)
                <= self.g
            )
        cap = p.cost.max_tokens_per_rank
        self.slot_tokens = []
        for j, slot in enumerate(self.slots):
            tokens = sum(p.tokens[i] * v for i, v in by_slot[j])
            self.slot_tokens.append(tokens)
            m.add(tokens <= slot.size * cap * self.used[j])
            m.add(tokens <= slot.size * self.max_tokens)
            m.add(sum(self.child_units(i, slot.size) * v for i, v in by_slot[j]) <= self.z)
        # Rank-seconds: the children's k * time add up to at most P * Z.
        m.add(
            sum(
                self.slots[j].size * self.child_units(i, self.slots[j].size) * v
                for (i, j), v in self.x.items()
            )
            <= self.size * self.z
        )

    def _symmetry(self) -> None:
        """Same-size slots of a node used first and loaded in order; nodes ordered by tokens."""
        m = self.model
        for j in range(1, len(self.slots)):
            a, b = self.slots[j - 1], self.slots[j]
            if (a.node, a.size) == (b.node, b.size):
                m.add(self.used[j - 1] >= self.used[j])
                m.add(self.slot_tokens[j - 1] >= self.slot_tokens[j])
        node_tokens = [
            sum(t for t, s in zip(self.slot_tokens, self.slots, strict=True) if s.node == n)
            for n in range(self.nodes)
        ]
        for n in range(1, self.nodes):
            self.model.add(node_tokens[n - 1] >= node_tokens[n])

    def _objective(self) -> None:
        """Full layers' busiest-rank term plus sparse layers' slowest child (constants apart)."""
        cost = self.p.cost
        self.m_units = math.floor(self.full_per_token_s / self.unit_s)
        self.model.minimize(self.m_units * self.max_tokens + cost.sparse_layers * self.z)

    # --- hint and solve -----------------------------------------------------------------
    def hint(self, parent: Parent) -> None:
        """Write a complete hint from a repacked layout, relabelled to the symmetry order."""
        p = self.p
        nodes: list[list[Child]] = [[] for _ in range(self.nodes)]
        for c in parent.children:
            if c.samples:
                nodes[(c.start - self.start) // self.g].append(c)
        load = [sum(p.tokens[s] for c in kids for s in c.samples) for kids in nodes]
        order = sorted(range(self.nodes), key=lambda n: (-load[n], n))
        chosen: dict[int, Child] = {}
        for new_n, old_n in enumerate(order):
            for k in self.sizes:
                kids = sorted(
                    (c for c in nodes[old_n] if c.size == k),
                    key=lambda c: -sum(p.tokens[s] for s in c.samples),
                )
                slots = [j for j, s in enumerate(self.slots) if s.node == new_n and s.size == k]
                for j, c in zip(slots, kids, strict=False):
                    chosen[j] = c
        proto = self.model.proto.solution_hint
        for j, var in enumerate(self.used):
            proto.vars.append(var.index)
            proto.values.append(int(j in chosen))
        where = {s: j for j, c in chosen.items() for s in c.samples}
        for (i, j), var in self.x.items():
            proto.vars.append(var.index)
            proto.values.append(int(where.get(i) == j))
        busiest = max(-(-sum(p.tokens[s] for s in c.samples) // c.size) for c in chosen.values())
        slowest = max(sum(self.child_units(s, c.size) for s in c.samples) for c in chosen.values())
        for var, value in ((self.max_tokens, busiest), (self.z, slowest)):
            proto.vars.append(var.index)
            proto.values.append(value)

    def solve(
        self, deadline_s: float, work_limit_s: float = DETERMINISTIC_SECONDS
    ) -> ChildModelResult:
        """Solve within ``work_limit_s`` deterministic seconds (repeatable) and ``deadline_s``
        wall seconds (the safety net)."""
        solver = cp_model.CpSolver()
        params = solver.parameters
        params.num_workers = 1  # single worker: deterministic search
        params.max_deterministic_time = work_limit_s
        params.max_time_in_seconds = max(deadline_s, 1e-3)
        params.cp_model_presolve = False  # presolve costs more than it saves at this size
        params.random_seed = 0
        params.cp_model_probing_level = 0  # probing alone would eat the whole work limit
        status = solver.solve(self.model)
        bound = min(self.incumbent, self.full_const_s + solver.best_objective_bound * self.unit_s)
        found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        # An open search that stopped before its deterministic limit was stopped by the clock.
        wall = solver.deterministic_time < work_limit_s * WORK_LIMIT_REACHED
        if status == cp_model.INFEASIBLE:
            # Nothing beats the incumbent: the incumbent is a bound of the repacked layouts.
            return ChildModelResult(None, self.incumbent, True, False)
        return ChildModelResult(
            self._layout(solver) if found else None,
            bound,
            status == cp_model.OPTIMAL,
            wall and status != cp_model.OPTIMAL,
            self.full_const_s + solver.objective_value * self.unit_s if found else None,
        )

    def _layout(self, solver: cp_model.CpSolver) -> Parent:
        """Aligned children from the solution: per node, used slots largest first."""
        children: list[Child] = []
        for n in range(self.nodes):
            slots = [
                j for j, s in enumerate(self.slots) if s.node == n and solver.value(self.used[j])
            ]
            slots.sort(key=lambda j: (-self.slots[j].size, j))
            at = self.start + n * self.g
            for j in slots:
                members = tuple(
                    i for i in self.members if (i, j) in self.x and solver.value(self.x[i, j])
                )
                children.append(Child(at, self.slots[j].size, members))
                at += self.slots[j].size
            end = self.start + (n + 1) * self.g
            while at < end:  # idle ranks: empty aligned children
                k = max(k for k in self.sizes if at % k == 0 and at + k <= end)
                children.append(Child(at, k, ()))
                at += k
        return Parent(self.start, self.size, tuple(children))
