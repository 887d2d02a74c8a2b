"""CP-SAT model of a neighbourhood of a layout: which parent, node and child each freed sample
goes to, and which children the freed nodes use, minimising the step time (min-max over
parents of the cost model's time).

The full joint model (samples -> parents -> node-level child slots) is too large to build in a
64-GPU latency budget (~685 samples x 64 ranks x a 15-slot menu per node), so it is only ever
built for a neighbourhood (``Neighbourhood``): a few parents, a set of freed samples and a set
of freed nodes; everything else keeps its place. Within the neighbourhood the model has

* **bins**: the kept children of the neighbourhood's parents (their remaining samples are
  constants), and on every freed node a fixed menu of slots, ``g/k`` of each child size ``k``
  with a usage boolean and ``sum k * used <= g`` (as in ``child_cpsat``); a parent wider than a
  node whose nodes are all freed also gets its whole-parent slot (the unrepacked layout), which
  excludes the menus;
* ``x[i, bin]`` for freed sample ``i`` only where it fits the bin's memory (``k x
  max_tokens_per_rank``, the level where memory binds) and a sample longer than a node only in
  a whole-parent slot;
* per parent ``M`` (busiest rank's tokens, exact: ``k * M >= tokens``) and ``Z`` (slowest
  child's sparse layers, ``ceil(T/k)`` relaxed to ``T/k``), and ``T >= `` every parent's time,
  including the constant time of the parents outside.

Seconds become integer units (``cpsat_units``); coefficients are rounded to nearest, since the
model only proposes: the move is accepted only if the exact evaluator (``layout.evaluate``)
agrees (``membership_lns``). The current layout is written as a complete hint, so CP-SAT starts
from it and the answer is never worse under the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from ortools.sat.python import cp_model

from solver.child_cpsat import WORK_LIMIT_REACHED
from solver.cpsat_model import LeanCpModel
from solver.cpsat_units import time_unit_s
from solver.layout import Child, Layout, Parent, parent_time, unrepacked
from solver.problem import Problem

SEED = 0
"""Fixed CP-SAT seed: single-worker search with a deterministic limit repeats exactly."""


@dataclass(frozen=True)
class Neighbourhood:
    """What one LNS move frees: ``parents`` (indices into the layout) whose samples may be
    exchanged, ``samples`` freed (all inside those parents) and ``nodes`` ((parent, node
    index) pairs whose children are re-chosen; their samples must all be freed)."""

    parents: tuple[int, ...]
    samples: tuple[int, ...]
    nodes: tuple[tuple[int, int], ...]
    targets: tuple[tuple[int, int], ...] | None = None
    kind: str = ""
    """Kept children, as (parent, child start), that freed samples may enter (None: all); a
    freed sample may always stay where it is. Narrows the model to the children with room."""


@dataclass(frozen=True)
class JointResult:
    layout: Layout | None
    """The best layout found (None if none, e.g. the clock stopped the search first)."""
    work_s: float
    """Deterministic seconds CP-SAT spent (repeatable: the LNS budget is charged with it)."""
    stopped_by_time: bool
    """The wall-clock safety net, not the work limit, ended an open search."""


@dataclass(frozen=True)
class _Bin:
    parent: int  # position in the neighbourhood's parents
    size: int
    start: int  # a kept child's start; a menu slot's node start; a whole slot's parent start
    kept: tuple[int, ...]  # samples that stay in a kept child
    node: tuple[int, int] | None  # the freed node of a menu slot
    whole: bool = False
    fixed: bool = False  # a kept child: always there, whatever it ends up holding


def unsplit(problem: Problem, par: Parent) -> bool:
    """An unrepacked parent wider than any child: one bin, freed only as a whole."""
    return not par.repacked and par.size > max(problem.child_sizes)


def node_of(parent: Parent, child: Child, gpus_per_node: int) -> int:
    """Index of the node (inside ``parent``) that holds a node-local child."""
    return (child.start - parent.start) // min(parent.size, gpus_per_node)


class JointModel:
    """The neighbourhood ``hood`` of ``layout`` as a CP-SAT model with ``layout`` as hint."""

    def __init__(
        self,
        problem: Problem,
        layout: Layout,
        hood: Neighbourhood,
        shares: dict[tuple[float, int], list[int]] | None = None,
        exact: dict[int, tuple[Parent, float]] | None = None,
    ) -> None:
        """``shares``: a cache of per-sample child shares kept across the moves of one
        request (they depend only on the problem and the time unit). ``exact``: a cache of
        parent times across those moves, ``position -> (parent, its time)``, used while that
        position holds the same parent object (a move replaces only its own parents; the
        times of the parents outside were a third of the model's build)."""
        self.p, self.layout, self.hood = problem, layout, hood
        self._share_cache = {} if shares is None else shares
        self._exact_cache = {} if exact is None else exact
        cost = problem.cost
        self.free = set(hood.samples)
        freed_nodes = set(hood.nodes)
        self.bins: list[_Bin] = []
        hint_bin: dict[int, int] = {}  # freed sample -> bin in the current layout
        hint_used: set[int] = set()
        outside = [j for j in range(len(layout)) if j not in hood.parents]
        for q, j in enumerate(hood.parents):
            par = layout[j]
            g = min(par.size, cost.gpus_per_node)
            all_freed = all((j, n) in freed_nodes for n in range(par.size // g))
            whole_now = unsplit(problem, par)
            if whole_now and not all_freed:  # an unrepacked wide parent is one kept bin
                self._add_kept(q, par.children[0], hint_bin, hint_used)
                continue
            if par.size > max(problem.child_sizes) and all_freed:
                self.bins.append(_Bin(q, par.size, par.start, (), None, whole=True))
                if whole_now:
                    hint_used.add(len(self.bins) - 1)
                    for s in par.samples:
                        hint_bin[s] = len(self.bins) - 1
            for n in range(par.size // g):
                kids = [c for c in par.children if not whole_now and node_of(par, c, g) == n]
                if (j, n) not in freed_nodes:
                    for c in kids:
                        self._add_kept(q, c, hint_bin, hint_used)
                    continue
                for k in (k for k in problem.child_sizes if k <= g):
                    now = [c for c in kids if c.size == k and c.samples]
                    for slot in range(g // k):
                        b = len(self.bins)
                        self.bins.append(_Bin(q, k, par.start + n * g, (), (j, n)))
                        if slot < len(now):
                            hint_used.add(b)
                            for s in now[slot].samples:
                                hint_bin[s] = b
        key = ("joint_model.unit_s",)  # the same for every move of a request
        if key not in problem.memo:
            problem.memo[key] = time_unit_s(4 * self._rough_seconds())
        self.unit_s = problem.memo[key]
        self.outside_units = max((self._units(self._outside(j)) for j in outside), default=0)
        self._build(hint_bin, hint_used)

    # --- helpers ------------------------------------------------------------------------
    def _add_kept(
        self, q: int, child: Child, hint_bin: dict[int, int], hint_used: set[int]
    ) -> None:
        b = len(self.bins)
        kept = tuple(s for s in child.samples if s not in self.free)
        self.bins.append(_Bin(q, child.size, child.start, kept, None, fixed=True))
        hint_used.add(b)
        for s in child.samples:
            if s in self.free:
                hint_bin[s] = b

    def _rough_seconds(self) -> float:
        """Every sample of the step in the slowest layout: no parent's expression sums to
        more (the same for every parent, so computed once per model)."""
        cost, p = self.p.cost, self.p
        per_token = cost.linear_seconds_per_token + cost.a2a_seconds_per_token(cost.world_size)
        total = sum(p.sparse_s) + sum(p.tokens) * per_token
        layers = cost.full_layers + cost.sparse_layers
        return layers * (total + sum(p.full_s)) + layers * 4 * cost.layer_fixed_seconds(2)

    def _exact(self, par: Parent) -> float:
        return parent_time(par, self.p.cost, self.p.costs)

    def _outside(self, j: int) -> float:
        """``_exact`` of the layout's parent ``j``, from the cache while it holds that parent."""
        par = self.layout[j]
        known = self._exact_cache.get(j)
        if known is None or known[0] is not par:
            known = self._exact_cache[j] = (par, self._exact(par))
        return known[1]

    def _units(self, seconds: float) -> int:
        return round(seconds / self.unit_s)

    # --- model --------------------------------------------------------------------------
    def _shares(self, k: int) -> list[int]:
        """Per sample: its sparse-layer share of a size-k child (``ceil`` relaxed), in units."""
        key = (self.unit_s, k)
        if key not in self._share_cache:
            cost, p = self.p.cost, self.p
            per_token = cost.linear_seconds_per_token + cost.a2a_seconds_per_token(k)
            scale = cost.sparse_layers / k / self.unit_s
            self._share_cache[key] = [
                round((sp + t * per_token) * scale)
                for sp, t in zip(p.sparse_s, p.tokens, strict=True)
            ]
        return self._share_cache[key]

    def _build(self, hint_bin: dict[int, int], hint_used: set[int]) -> None:
        p, cost = self.p, self.p.cost
        tokens = p.tokens
        m = self.model = LeanCpModel()
        cap = cost.max_tokens_per_rank
        node_cap = cost.gpus_per_node * cap
        self.used = {b: m.new_bool_var("") for b, bin_ in enumerate(self.bins) if not bin_.fixed}
        targets = None if self.hood.targets is None else set(self.hood.targets)
        parents = self.hood.parents
        open_bin = [
            not bin_.fixed or targets is None or (parents[bin_.parent], bin_.start) in targets
            for bin_ in self.bins
        ]
        # Kept children are always there (possibly holding only freed samples).
        self.x: dict[tuple[int, int], cp_model.IntVar] = {}
        by_bin: list[list[tuple[int, cp_model.IntVar]]] = [[] for _ in self.bins]
        for i in sorted(self.free):
            row = []
            t_i = tokens[i]
            now = hint_bin.get(i)
            for b, bin_ in enumerate(self.bins):
                if t_i > bin_.size * cap or not (open_bin[b] or b == now):
                    continue
                if t_i > node_cap and not (bin_.whole or bin_.size > cost.gpus_per_node):
                    continue
                var = m.new_bool_var("")
                self.x[i, b] = var
                by_bin[b].append((i, var))
                row.append(var)
            if not row:
                raise ValueError(f"sample {i} fits no bin of the neighbourhood")
            m.add_exactly_one(row)
        # Menus: per freed node, used sizes fill at most the node; whole slots exclude them.
        whole = {b.parent: i for i, b in enumerate(self.bins) if b.whole}
        nodes: dict[tuple[int, int], list[int]] = {}
        for b, bin_ in enumerate(self.bins):
            if bin_.node is not None:
                nodes.setdefault(bin_.node, []).append(b)
        for (j, _), slots in nodes.items():
            g = min(self.layout[j].size, cost.gpus_per_node)
            q = parents.index(j)
            terms = [self.used[b] for b in slots]
            weights = [self.bins[b].size for b in slots]
            if q in whole:
                terms.append(self.used[whole[q]])
                weights.append(g)
            m.add(cp_model.LinearExpr.weighted_sum(terms, weights) <= g)
            for a, b in pairwise(slots):  # same-size slots used in order
                if self.bins[a].size == self.bins[b].size:
                    m.add(self.used[a] >= self.used[b])
        # Per parent: M (busiest rank tokens), Z (slowest child's sparse layers), time <= T.
        self.t = m.new_int_var(self.outside_units, 1 << 60, "T")
        hint_vals: dict[int, int] = {self.t.index: self.outside_units}
        hint_bins: dict[int, list[int]] = {}
        for i, b in hint_bin.items():
            hint_bins.setdefault(b, []).append(i)
        weighted = cp_model.LinearExpr.weighted_sum
        for q, j in enumerate(parents):
            par = self.layout[j]
            mine = [b for b, bin_ in enumerate(self.bins) if bin_.parent == q]
            kept_samples = [s for b in mine for s in self.bins[b].kept]
            full_scale = cost.full_layers / par.size / self.unit_s
            per_token = self._units(
                cost.full_layers
                * (cost.linear_seconds_per_token + cost.a2a_seconds_per_token(par.size))
            )
            const = self._units(cost.full_layers * cost.layer_fixed_seconds(par.size)) + round(
                sum(p.full_s[s] for s in kept_samples) * full_scale
            )
            # A kept child no freed sample may enter is a constant: a floor on M and Z.
            m_lo = z_lo = 0
            open_bins = []
            for b in mine:
                bin_ = self.bins[b]
                if bin_.fixed and not by_bin[b]:
                    k = bin_.size
                    coll = self._units(cost.sparse_layers * cost.layer_fixed_seconds(k))
                    m_lo = max(m_lo, -(-sum(tokens[s] for s in bin_.kept) // k))
                    z_lo = max(z_lo, sum(self._shares(k)[s] for s in bin_.kept) + coll)
                else:
                    open_bins.append(b)
            mv = m.new_int_var(min(m_lo, cap), cap, f"M{q}")
            zv = m.new_int_var(z_lo, max(z_lo, 1 << 50), f"Z{q}")
            m_hint, z_hint = m_lo, z_lo
            full_vars: list[cp_model.IntVar] = []
            full_w: list[int] = []
            hint_full = 0
            for b in open_bins:
                bin_ = self.bins[b]
                k = bin_.size
                shares = self._shares(k)
                xs = [v for _, v in by_bin[b]]
                kept_tok = sum(tokens[s] for s in bin_.kept)
                tok = weighted(xs, [tokens[i] for i, _ in by_bin[b]]) + kept_tok
                share = sum(shares[s] for s in bin_.kept)
                share_x = weighted(xs, [shares[i] for i, _ in by_bin[b]])
                coll = self._units(cost.sparse_layers * cost.layer_fixed_seconds(k))
                if bin_.fixed:
                    m.add(tok <= k * cap)
                    m.add(share_x + (share + coll) <= zv)
                else:
                    m.add(tok <= k * cap * self.used[b])
                    m.add(share_x + coll * self.used[b] <= zv)
                m.add(tok <= k * mv)
                full_vars.extend(xs)
                full_w.extend(round(p.full_s[i] * full_scale) for i, _ in by_bin[b])
                hinted = hint_bins.get(b, [])
                h_tok = kept_tok + sum(tokens[i] for i in hinted)
                m_hint = max(m_hint, -(-h_tok // k))
                used_h = bin_.fixed or b in hint_used
                z_hint = max(
                    z_hint, share + sum(shares[i] for i in hinted) + (coll if used_h else 0)
                )
                hint_full += sum(round(p.full_s[i] * full_scale) for i in hinted)
            m.add(weighted(full_vars, full_w) + per_token * mv + zv + const <= self.t)
            hint_vals[mv.index] = m_hint
            hint_vals[zv.index] = z_hint
            hint_t = const + hint_full + per_token * m_hint + z_hint
            hint_vals[self.t.index] = max(hint_vals[self.t.index], hint_t)
        m.minimize(self.t)
        proto = m.proto.solution_hint
        for b, var in self.used.items():
            proto.vars.append(var.index)
            proto.values.append(int(b in hint_used))
        for (i, b), var in self.x.items():
            proto.vars.append(var.index)
            proto.values.append(int(hint_bin.get(i) == b))
        for index, value in hint_vals.items():
            proto.vars.append(index)
            proto.values.append(value)

    # --- solve --------------------------------------------------------------------------
    @property
    def pairs(self) -> int:
        return len(self.x)

    def solve(self, work_limit_s: float, deadline_s: float) -> JointResult:
        """The best layout found within ``work_limit_s`` deterministic seconds (and the
        ``deadline_s`` safety net)."""
        solver = cp_model.CpSolver()
        params = solver.parameters
        params.num_workers = 1
        params.max_deterministic_time = work_limit_s
        params.max_time_in_seconds = max(deadline_s, 1e-3)
        params.random_seed = SEED
        params.cp_model_presolve = False
        params.cp_model_probing_level = 0
        # Finding a better assignment near the hint matters, not the bound: no LP, and quick
        # restarts (measured on the packed trace: the first improvement at a third of the work).
        params.linearization_level = 0
        params.search_branching = cp_model.PORTFOLIO_WITH_QUICK_RESTART_SEARCH
        status = solver.solve(self.model)
        work = solver.deterministic_time
        # An open search that stopped before its deterministic limit was stopped by the clock.
        by_clock = status != cp_model.OPTIMAL and work < work_limit_s * WORK_LIMIT_REACHED
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return JointResult(None, work, by_clock)
        return JointResult(self._layout(solver), work, by_clock)

    def _layout(self, solver: cp_model.CpSolver) -> Layout:
        cost = self.p.cost
        content: list[list[int]] = [list(b.kept) for b in self.bins]
        for (i, b), var in self.x.items():
            if solver.value(var):
                content[b].append(i)
        out = list(self.layout)
        for q, j in enumerate(self.hood.parents):
            par = self.layout[j]
            g = min(par.size, cost.gpus_per_node)
            mine = [b for b, bin_ in enumerate(self.bins) if bin_.parent == q]
            whole = [b for b in mine if self.bins[b].whole or self.bins[b].size == par.size > g]
            if whole and (self.bins[whole[0]].fixed or solver.value(self.used[whole[0]])):
                out[j] = unrepacked(par.start, par.size, sorted(content[whole[0]]))
                continue
            children: list[Child] = []
            for n in range(par.size // g):
                at, end = par.start + n * g, par.start + (n + 1) * g
                here = [
                    b
                    for b in mine
                    if not self.bins[b].whole and (self.bins[b].start - par.start) // g == n
                ]
                kept = [b for b in here if self.bins[b].node is None]
                if kept:  # a kept node: same children, new contents
                    for b in sorted(kept, key=lambda b: self.bins[b].start):
                        samples = tuple(sorted(content[b]))
                        children.append(Child(self.bins[b].start, self.bins[b].size, samples))
                    continue
                chosen = [b for b in here if solver.value(self.used[b]) or content[b]]
                chosen.sort(key=lambda b: (-self.bins[b].size, b))
                for b in chosen:
                    children.append(Child(at, self.bins[b].size, tuple(sorted(content[b]))))
                    at += self.bins[b].size
                while at < end:  # idle ranks: empty aligned children
                    k = max(k for k in self.p.child_sizes if at % k == 0 and at + k <= end)
                    children.append(Child(at, k, ()))
                    at += k
            out[j] = Parent(par.start, par.size, tuple(children))
        return tuple(out)


def freed_samples(problem: Problem, layout: Layout, nodes: Sequence[tuple[int, int]]) -> set[int]:
    """Samples held by the given (parent, node) pairs."""
    out: set[int] = set()
    for j, n in nodes:
        par = layout[j]
        g = min(par.size, problem.cost.gpus_per_node)
        if unsplit(problem, par):
            out.update(par.samples)
            continue
        for c in par.children:
            if node_of(par, c, g) == n:
                out.update(c.samples)
    return out
