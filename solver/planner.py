"""The planner's entry point: a PlanRequest in, a valid Plan out, for every mode.

Pipeline (each stage deterministic; the wall-clock deadline is only a safety net):

1. parent sizes: the request's, or derived (``parent_sizing``);
2. baseline membership: the request's ``parent_of``, or the balanced default;
3. mode ``repack``: children for that membership, parent by parent, critical parent first;
4. mode ``repack+parent``: membership re-balanced for repacking, children again; the better of
   this and step 3 is returned, so the modes are ordered baseline >= repack >= repack+parent;
5. mode ``repack+sizing``: heterogeneous parent sizes and membership from the parent packer,
   children again; the better of this and step 4 (so it is never slower than repack+parent);
6. mode ``sizing``: the parent packer without repacking (FlexSP-style), never slower than the
   baseline.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

from solver.bounds import (
    fixed_membership_bound,
    membership_free_bound,
    reported_bound,
    sizes_bound,
)
from solver.budget import DEFAULT_DEADLINE_MS, Budget, WorkPool, work_scale
from solver.child_swaps import swap_children
from solver.children import (
    ChildrenSolution,
    children_below,
    membership_bounds,
    polish,
    solve_children,
)
from solver.collector import collector_held_back
from solver.errors import InfeasibleRequestError
from solver.layout import Layout, LayoutEval, baseline_layout, evaluate
from solver.membership import Objective, balance, make_room, members_from_parent_of
from solver.membership_lns import MIN_GAIN, improve, search_scale, searches
from solver.node_child_sizes import resized
from solver.node_membership import TIGHT_FILL, node_seed, node_seeds, small_request
from solver.node_repack_moves import repack_moves, repacks_nodes
from solver.parent_packer import ParentPacker, SizedMembership
from solver.parent_sizing import derive_parent_sizes
from solver.plan_builder import SolveOutcome, build_plan
from solver.problem import Problem
from solver.schema import Mode, Plan, PlanRequest, StoppedBy, allowed_parent_sizes
from solver.tilings import best_tilings, candidate_tilings, tiling_memberships, wide_tilings

ASSEMBLY_MS_PER_RANK = 0.012
ASSEMBLY_MS_PER_SAMPLE = 0.004
"""Measured cost of building and evaluating the final plan (2-core CPU), kept back from the
deadline."""

UPSTREAM_OBJECTIVE: Objective = "tokens"
"""The default membership (no ``parent_of``) models a data loader that balances tokens per
rank across parents, as loaders without a cost model do; the baseline is measured on it."""

UPSTREAM_EVALS = 500
"""Local-search budget of the upstream membership: token LPT is already close to even."""
GAP_TOLERANCE = 1e-9
BOUND_SLACK = 1e-9
"""Float noise allowed between a bound and the plan it bounds."""

SIZING_OBJECTIVES: tuple[Objective, ...] = ("baseline", "repack")
TILINGS_REPACKED = 2
"""Fastest simple tilings (unrepacked) that ``repack+sizing`` solves children on."""
TIGHT_ROUNDS = 3
"""Rounds of search a memory-tight step's final layout gets beyond the first, while each gains
(``_searched_further``)."""
FURTHER_SCALE = 1.0
"""LNS budget multiple of those rounds (the first round has the mode's ``search_scale``)."""
FINISH_POOL = 2.0
"""Mode ``repack``'s answer finishes several layouts of one membership (the polished children
and, on small requests, every node-stage seed; ``_fixed_best``): their child swaps and node
re-packs share this many times one finish's limits (``budget.WorkPool``). On few-sample steps
each finish ends far short of its limit (the 16-GPU bench: the swaps of a whole request used
at most 0.56 of one), so all are finished as before; on many-sample ones each used its whole
limit, up to 7x in all: 16 GPUs, one 16-rank parent, 277 samples at 90% (2026-12-07 evening
fuzz) took 1.0 s of CPU in mode ``repack`` and 1.5 s in `repack+parent`, 32 GPUs of 4-GPU nodes,
358 samples, 3.0 s in `repack+sizing`."""
ROUNDS_MAX_RANKS = 128
"""Widest cluster that gets them: on packed 256-GPU steps they gained 0.02-0.09% for ~200 ms
of CPU (at 128 GPUs 0-0.58% for ~150 ms, at 64 GPUs up to 1.6%)."""


@dataclass(frozen=True)
class _Candidate:
    layout: Layout
    evaluation: LayoutEval
    lower_bound_s: float
    searched: bool = False
    """The layout already came out of ``_improved`` (no second search from it)."""
    settled: bool = False
    """The layout already came out of ``_searched_further`` (no more rounds from it)."""


@dataclass(frozen=True)
class _Sized:
    """``repack+sizing``'s layout before the LNS, and the best layout of each simple tiling it
    solved children on (the LNS's other starting points on memory-tight steps)."""

    best: _Candidate
    tilings: tuple[ChildrenSolution, ...] = ()


def _baseline_parents(problem: Problem, request: PlanRequest) -> tuple[list[int], list[list[int]]]:
    """Parent sizes and the baseline membership: the request's, else derived and balanced."""
    if request.parent_sizes is not None:
        sizes = list(request.parent_sizes)
        if request.parent_of is not None:
            return sizes, members_from_parent_of(request.parent_of, len(sizes))
        return sizes, balance(problem, sizes, UPSTREAM_OBJECTIVE, evals=UPSTREAM_EVALS)
    sizes, greedy = derive_parent_sizes(problem, request)
    return sizes, balance(problem, sizes, UPSTREAM_OBJECTIVE, start=greedy, evals=UPSTREAM_EVALS)


def plan(request: PlanRequest, deadline_ms: float | None = None, *, use_cpsat: bool = True) -> Plan:
    """Solve one step. The search done depends on the request alone (its ``deadline_ms`` sets
    the deterministic work budget); ``deadline_ms`` here overrides only the wall-clock safety
    net (the service passes what is left after queueing). ``use_cpsat=False`` returns the
    greedy plan (for benchmarks). The garbage collector is held back while it runs
    (``collector``: it was 13% of a 1,024-GPU solve)."""
    with collector_held_back():
        return _plan(request, deadline_ms, use_cpsat)


def _plan(request: PlanRequest, deadline_ms: float | None, use_cpsat: bool) -> Plan:
    t0 = time.perf_counter()
    requested = request.deadline_ms or DEFAULT_DEADLINE_MS
    deadline = deadline_ms or requested
    # Keep back the time the plan's assembly takes (split sizes for every rank), so the
    # finished plan, not just the search, comes back within the deadline.
    reserve_ms = ASSEMBLY_MS_PER_RANK * request.cluster.world_size + ASSEMBLY_MS_PER_SAMPLE * len(
        request.lengths
    )
    budget = Budget(max(deadline - reserve_ms, 0.0), use_cpsat, scale=work_scale(requested))
    mode: Mode = request.resolved_mode
    problem = Problem.from_request(request)
    sizes, base_members = _baseline_parents(problem, request)
    base_layout = baseline_layout(sizes, base_members)
    base_eval = evaluate(base_layout, problem.cost, problem.costs)
    # Mode `baseline` searches nothing: its layout is the upstream one by definition (the
    # request's `parent_of`, else the token-balanced loader model), so it is its own bound.
    base = _Candidate(base_layout, base_eval, base_eval.step_s)
    best = {
        "baseline": lambda: base,
        "sizing": lambda: _sizing(problem, request, base, sizes, base_members, budget),
        "repack": lambda: _repack(problem, sizes, base_members, budget),
        "repack+parent": lambda: _parent_mode(problem, sizes, base_members, budget),
        "repack+sizing": lambda: _searched_repack_sizing(
            problem, request, base, sizes, base_members, budget
        ),
    }[mode]()
    if best.evaluation.step_s > base.evaluation.step_s:
        # Only where the safety net fired mid-search (a request deadline of 1 ms left
        # repack+sizing a sized layout 2,660x slower): the upstream layout, unrepacked, is a
        # layout of every mode, so no mode answers slower than it.
        best = _Candidate(base.layout, base.evaluation, best.lower_bound_s)
    allowed = allowed_parent_sizes(request.cluster, request.model, uniform=False)
    tighter = reported_bound(problem, mode, sizes, base_members, allowed)
    best = _Candidate(best.layout, best.evaluation, max(best.lower_bound_s, tighter))
    outcome = _outcome(best, base.evaluation, budget)
    return build_plan(
        request,
        mode,
        outcome,
        problem.cost,
        problem.costs.model_flops,
        solve_ms=(time.perf_counter() - t0) * 1e3,
    )


def _repack(
    problem: Problem, sizes: list[int], members: list[list[int]], budget: Budget
) -> _Candidate:
    """Children for the upstream membership; the bound holds for that membership. The
    node-by-node stage with that membership kept is a second candidate."""
    fixed = _fixed_best(
        problem, sizes, members, solve_children(problem, sizes, members, budget), budget
    )
    return _Candidate(fixed.layout, fixed.evaluation, max(fixed.parent_bounds))


def _fixed_best(
    problem: Problem,
    sizes: list[int],
    members: list[list[int]],
    greedy: ChildrenSolution,
    budget: Budget,
    every_seed: bool = True,
) -> ChildrenSolution:
    """Mode ``repack``'s answer for a membership: the greedy children polished by CP-SAT, or
    the node-by-node layout of the same membership if that is faster; then sample swaps
    between the critical parent's children (``child_swaps``, membership kept): the stages
    before them move one sample at a time, and a parent packed to its memory needs
    exchanges (packed steps of small clusters ended 0.1-0.6% behind the tests' reference
    heuristic, which re-packs after every move, on 13 of 39 such requests).

    The polished children and the node stage's layouts (``node_seeds``) are all finished with
    the swaps, and the fastest kept: the one ahead before the swaps is not always ahead after
    them (one 8-rank parent of 2-GPU nodes, 37% fill: the polished children 1679.2 -> 1678.9
    ms, the node stage's 1693.6 -> 1676.1 ms, the reference 1674.5 ms; another, 88 samples:
    the node stage's fastest seed 933.3 -> 931.8 ms, its slowest 934.2 -> 928.4 ms, the
    reference 927.9 ms). Larger requests finish the polished children and the fastest seed
    only (every seed doubled mode ``repack``'s CPU on packed 64-GPU steps); until 2026-12-04
    they finished just the faster of the two, which left two hunted 32-GPU steps 0.37-0.42%
    behind the reference (tests/solver/test_reference.py). ``every_seed=False`` finishes those
    two on small requests too: ``repack+sizing``'s speculative wide tiling, pruned against its
    incumbent, does not need ``repack``'s exact answer (packed 32-GPU steps: the mode's CPU
    -8%, up to 1.50 -> 1.03 s, and the same plans on 60 packed wide steps of 32-128 GPUs)."""
    fixed = polish(problem, greedy, budget)
    seeds = [] if budget.expired() else node_seeds(problem, sizes, budget, fixed=members)
    layouts = [
        ChildrenSolution(layout, evaluate(layout, problem.cost, problem.costs), fixed.parent_bounds)
        for _, layout in seeds
    ]
    candidates = [fixed]
    if every_seed and small_request(problem, sizes):
        candidates += layouts
    elif layouts:
        candidates.append(min(layouts, key=lambda c: c.evaluation.step_s))
    pool = WorkPool(FINISH_POOL)
    finished = [_swapped_and_resized(problem, c, budget, pool) for c in _distinct(candidates)]
    return min(finished, key=lambda c: c.evaluation.step_s)  # ties: the polished children


def _distinct(candidates: list[ChildrenSolution]) -> list[ChildrenSolution]:
    """The first of each layout: the polished children and the node stage's seeds often
    coincide (on packed 16-GPU steps of one 16-rank parent, 14 of 35 layouts finished were
    repeats, 11% of the finishing's CPU), and a layout's finish depends on the layout alone."""
    unique: list[ChildrenSolution] = []
    for c in candidates:
        if all(c.layout != u.layout for u in unique):
            unique.append(c)
    return unique


def _swapped_and_resized(
    problem: Problem, fixed: ChildrenSolution, budget: Budget, pool: WorkPool
) -> ChildrenSolution:
    """``fixed`` finished by the child swaps within parents and per-node child sizes
    (``node_child_sizes``); as it was where it already meets its parents' bounds. The swaps
    and node re-packs draw from ``pool``, shared by the layouts finished for one answer."""
    if budget.expired() or fixed.evaluation.step_s <= max(fixed.parent_bounds):
        return fixed
    swapped = swap_children(problem, fixed.layout, budget, within=True, pool=pool)
    if swapped is not fixed.layout:
        evaluation = evaluate(swapped, problem.cost, problem.costs)
        if evaluation.step_s < fixed.evaluation.step_s:
            fixed = ChildrenSolution(swapped, evaluation, fixed.parent_bounds)
    if repacks_nodes(problem, [par.size for par in fixed.layout]) and not budget.expired():
        moved = repack_moves(problem, fixed.layout, budget, pool)
        if moved is not fixed.layout:
            moved = swap_children(problem, moved, budget, within=True, pool=pool)
            evaluation = evaluate(moved, problem.cost, problem.costs)
            if evaluation.step_s < fixed.evaluation.step_s:
                fixed = ChildrenSolution(moved, evaluation, fixed.parent_bounds)
    layout = resized(problem, fixed.layout)
    if layout is not fixed.layout:
        evaluation = evaluate(layout, problem.cost, problem.costs)
        if evaluation.step_s < fixed.evaluation.step_s:
            return ChildrenSolution(layout, evaluation, fixed.parent_bounds)
    return fixed


def _repack_parent(
    problem: Problem,
    sizes: list[int],
    members: list[list[int]],
    budget: Budget,
    incumbent_s: float = math.inf,
) -> _Candidate | None:
    """Membership re-solved for repacking, never slower than what ``repack`` returns
    (``_parent_layout`` with mode ``repack``'s answer computed where it is owed)."""
    found = _parent_layout(problem, sizes, members, budget, incumbent_s)
    return None if found is None else found.resolved()


def _searched_parent(
    problem: Problem,
    sizes: list[int],
    members: list[list[int]],
    budget: Budget,
    mode: Mode,
    incumbent_s: float = math.inf,
) -> _Candidate | None:
    """``_repack_parent``'s layout improved by the LNS (``_improved``): the same layout, but
    mode ``repack``'s answer is only computed when the searched layout does not already beat
    every layout of the upstream membership (its ``_Floor``). Where it is computed, the
    layout the LNS starts from is the one ``_repack_parent`` picks, so the plan is as before;
    where it is not, that answer could only have mattered by being the LNS's start instead
    (the plan stays never slower than it). On the 64-GPU bench steps it was computed on 7 of
    20 and lost on all of them, for ~60 ms each (CP-SAT polish and the child swaps)."""
    found = _parent_layout(problem, sizes, members, budget, incumbent_s)
    if found is None:
        return None
    searched = _improved(problem, found.candidate, budget, mode)
    owed, step_s = found.owed, searched.evaluation.step_s
    if owed is None or step_s <= max(owed.fixed.parent_bounds) or owed.floor.at_least(step_s):
        return _searched_further(problem, searched, budget, mode)
    picked = found.resolved()
    if picked is found.candidate:
        return _searched_further(problem, searched, budget, mode)
    again = _improved(problem, picked, budget, mode)
    # Both are searched layouts of this mode: the faster (ties: the eager order's). From
    # mode `repack`'s answer the search ends faster on most such steps (3 of 4 on
    # `gpu64-200steps.yaml`, by 0.2-0.5%), but not on all (one 0.03% slower).
    faster = searched if searched.evaluation.step_s < again.evaluation.step_s else again
    return _searched_further(problem, faster, budget, mode)


@dataclass(frozen=True)
class _OwedRepack:
    """Mode ``repack``'s answer for the upstream membership, not yet computed: ``fixed`` are
    its greedy children, ``floor`` bounds every layout of it."""

    sizes: list[int]
    members: list[list[int]]
    fixed: ChildrenSolution
    floor: _Floor
    every_seed: bool


@dataclass(frozen=True)
class _ParentLayout:
    """``repack+parent``'s layout before mode ``repack``'s answer is compared with it."""

    problem: Problem
    budget: Budget
    candidate: _Candidate
    owed: _OwedRepack | None = None

    def resolved(self) -> _Candidate:
        """The candidate, or mode ``repack``'s answer where that is at least as fast."""
        if self.owed is None:
            return self.candidate
        o = self.owed
        best = _fixed_best(self.problem, o.sizes, o.members, o.fixed, self.budget, o.every_seed)
        if self.candidate.evaluation.step_s < best.evaluation.step_s:
            return self.candidate  # already beats repack's exact result
        return _Candidate(best.layout, best.evaluation, self.candidate.lower_bound_s)


def _parent_layout(
    problem: Problem,
    sizes: list[int],
    members: list[list[int]],
    budget: Budget,
    incumbent_s: float = math.inf,
) -> _ParentLayout | None:
    """Membership re-solved for repacking; mode ``repack``'s answer owed where it may win.

    CP-SAT runs once where it can: a re-balanced membership whose greedy layout already beats
    the upstream membership's lower bound beats mode ``repack`` whatever CP-SAT would find
    there, so only the winner is polished (where the LNS runs next, it searches the winner
    instead: ``_polish_unless_searched``). Otherwise ``repack``'s exact result is owed
    (``_ParentLayout.resolved``) and the re-balanced layout must beat it.

    With ``incumbent_s`` (``repack+sizing``'s layout so far), None when no layout of the three
    memberships (upstream, re-balanced, node-level) can even tie it, as their parents' lower
    bounds show: then no child search runs for them.

    The bounds of a membership's layouts are its parents' own and, where those do not decide,
    the node-level memory bound (``_Floor``): on packed steps only the latter shows that
    ``repack``'s answer cannot matter (packed 32-GPU steps: -20% CPU, the same plans).
    """
    free = membership_free_bound(problem, sizes, repack=True)  # true for any membership

    def done(candidate: _Candidate) -> _ParentLayout:
        return _ParentLayout(problem, budget, candidate)

    fixed_bounds = membership_bounds(problem, sizes, members)
    pruning = incumbent_s < math.inf and not budget.expired()
    if pruning and _beyond(free, incumbent_s):
        return None  # no membership of these sizes can tie the incumbent
    # The node-level membership first: on large requests it gains the most, so a safety net
    # that fires in the stages after it still leaves its layout (the stages are independent:
    # where nothing fires, the same plans as in any order).
    seeded = _node_seeded(problem, sizes, budget)
    moved_members = _moved_members(problem, sizes, members, budget)
    fixed_floor = _Floor(problem, sizes, members, fixed_bounds)
    moved_bounds = membership_bounds(problem, sizes, moved_members)
    moved_floor = _Floor(problem, sizes, moved_members, moved_bounds)
    if pruning:  # their bounds, before any child search for them
        floors = [fixed_floor.value(), moved_floor.value()]
        if seeded is not None:
            floors.append(max(seeded.parent_bounds))
        if _beyond(min(floors), incumbent_s):
            return None
    # The node-level layout may already beat every layout of a membership, as its parents'
    # bounds show: then that membership's child search cannot change the answer (same plans;
    # on packed 1,024-GPU steps the searches are ~40% of the mode's CPU).
    seeded_s = math.inf if seeded is None else seeded.evaluation.step_s
    if seeded is not None and fixed_floor.at_least(seeded_s):
        if moved_floor.above(seeded_s):
            moved = seeded  # faster than any layout of the re-balanced membership too
        else:
            moved = solve_children(problem, sizes, moved_members, budget, moved_bounds)
            if seeded_s < moved.evaluation.step_s:
                moved = seeded
        moved = _polish_unless_searched(problem, moved, budget)
        return done(_Candidate(moved.layout, moved.evaluation, free))
    fixed = solve_children(problem, sizes, members, budget, fixed_bounds)
    if budget.expired():
        if seeded is not None and seeded.evaluation.step_s < fixed.evaluation.step_s:
            return done(_Candidate(seeded.layout, seeded.evaluation, free))
        return done(_Candidate(fixed.layout, fixed.evaluation, free))
    moved = solve_children(problem, sizes, moved_members, budget)
    if seeded is not None and seeded.evaluation.step_s < moved.evaluation.step_s:
        moved = seeded
    if moved.evaluation.step_s <= max(fixed.parent_bounds) or fixed_floor.at_least(
        moved.evaluation.step_s
    ):
        moved = _polish_unless_searched(problem, moved, budget)
        return done(_Candidate(moved.layout, moved.evaluation, free))
    if _beyond(fixed_floor.value(), incumbent_s):  # mode repack's answer cannot matter here
        return done(_Candidate(moved.layout, moved.evaluation, free))
    owed = _OwedRepack(sizes, members, fixed, fixed_floor, every_seed=incumbent_s == math.inf)
    return _ParentLayout(problem, budget, _Candidate(moved.layout, moved.evaluation, free), owed)


class _Floor:
    """Lower bound of every layout of one membership: its parents' bounds (``bounds``) first,
    the node-level memory bound (``fixed_membership_bound``, ~0.1 ms a parent) only where
    those do not already decide a comparison. Mode ``repack``'s exact answer and the child
    searches of a membership are skipped where it shows they cannot matter."""

    def __init__(
        self,
        problem: Problem,
        sizes: list[int],
        members: list[list[int]],
        bounds: tuple[float, ...],
    ) -> None:
        self._args = (problem, sizes, members)
        self._low = max(bounds)
        self._value: float | None = None

    def value(self) -> float:
        if self._value is None:
            self._value = max(self._low, fixed_membership_bound(*self._args))
        return self._value

    def at_least(self, step_s: float) -> bool:
        """Whether no layout of the membership is faster than ``step_s``."""
        return step_s <= self._low or step_s <= self.value()

    def above(self, step_s: float) -> bool:
        """Whether every layout of the membership is slower than ``step_s``."""
        return step_s < self._low or step_s < self.value()


def _moved_members(
    problem: Problem, sizes: list[int], members: list[list[int]], budget: Budget
) -> list[list[int]]:
    """The upstream membership re-balanced for repacking, with room made where memory binds."""
    moved = balance(problem, sizes, "repack", start=members, clock=budget)
    return make_room(problem, sizes, moved, clock=budget)


def _parent_mode(
    problem: Problem, sizes: list[int], members: list[list[int]], budget: Budget
) -> _Candidate:
    best = _searched_parent(problem, sizes, members, budget, "repack+parent")
    assert best is not None  # only pruned against an incumbent
    return best


def _node_seeded(problem: Problem, sizes: list[int], budget: Budget) -> ChildrenSolution | None:
    """Membership built node by node (``node_membership``): its own layout or the child
    packer's for its membership, whichever is faster."""
    if budget.expired():
        return None
    seeded = node_seed(problem, sizes, budget)
    evaluation = None if seeded is None else evaluate(seeded[1], problem.cost, problem.costs)
    if small_request(problem, sizes) and not budget.expired():
        # Every parent unrepacked, balanced by exact time: on mixed loader sizes with a sample
        # longer than a node, faster than any membership the repacked LPT reaches (16 GPUs of
        # 2-GPU nodes, parents [4, 8, 2, 2]: 1.35% behind the tests' reference heuristic).
        whole = node_seed(problem, sizes, budget, repack=False)
        if whole is not None:
            other = evaluate(whole[1], problem.cost, problem.costs)
            if evaluation is None or other.step_s < evaluation.step_s:
                seeded, evaluation = whole, other
    if seeded is None or evaluation is None:
        return None
    members, layout = seeded
    bounds = membership_bounds(problem, sizes, members)
    # The child packer's layout is only kept where it is at least as fast: its search stops
    # at the first parent clearly slower than the node-level layout (at 1,024 GPUs mostly the
    # first one it packs), which changes no plan (ties still go to the packer's layout).
    if evaluation.step_s <= max(bounds):
        return ChildrenSolution(layout, evaluation, bounds)  # nothing to gain from the packer
    limit = evaluation.step_s * (1 + 1e-9)
    packed = children_below(problem, sizes, members, budget, limit, bounds)
    if packed is None or evaluation.step_s < packed.evaluation.step_s:
        return ChildrenSolution(layout, evaluation, bounds)
    return packed


def _sized(
    problem: Problem,
    request: PlanRequest,
    objective: Objective,
    high: float,
    budget: Budget,
    below: float = math.inf,
) -> SizedMembership | None:
    allowed = allowed_parent_sizes(request.cluster, request.model, uniform=False)
    low = membership_free_bound(problem, allowed, repack=objective == "repack")
    sized = ParentPacker(problem, allowed, objective).solve(low, high, budget, below)
    if sized is None:
        return None
    members = balance(problem, sized.sizes, objective, start=sized.members, clock=budget)
    return SizedMembership(sized.sizes, members, sized.estimate_s)


def _rebalanced(
    problem: Problem, sizes: list[int], members: list[list[int]], budget: Budget
) -> list[list[list[int]]]:
    """The upstream sizes with membership balanced by exact unrepacked time: improved from the
    upstream membership, and LPT from scratch (which may not fit a loader's packed memory)."""
    out = [balance(problem, sizes, "baseline", start=members, clock=budget)]
    with contextlib.suppress(InfeasibleRequestError):  # a loader's packing may be tighter
        out.append(balance(problem, sizes, "baseline", clock=budget, exhaustive=False))
    seeded = node_seed(problem, sizes, budget, repack=False)  # LPT by work, exact moves
    if seeded is not None:
        out.append(seeded[0])
    return out


def _sizing(
    problem: Problem,
    request: PlanRequest,
    base: _Candidate,
    sizes: list[int],
    members: list[list[int]],
    budget: Budget,
) -> _Candidate:
    """FlexSP-style: heterogeneous parent sizes and membership, no repacking."""
    allowed = allowed_parent_sizes(request.cluster, request.model, uniform=False)
    bound = membership_free_bound(problem, allowed, repack=False)
    best = base
    # The upstream sizes re-balanced by exact time: a sizing that only moves samples.
    candidates = [(sizes, m) for m in _rebalanced(problem, sizes, members, budget)]
    sized = _sized(problem, request, "baseline", base.evaluation.step_s, budget)
    if sized is not None and not budget.expired():
        candidates.append((sized.sizes, sized.members))
    for cand_sizes, cand_members in candidates:
        layout = baseline_layout(cand_sizes, cand_members)
        evaluation = evaluate(layout, problem.cost, problem.costs)
        if evaluation.step_s < best.evaluation.step_s:
            best = _Candidate(layout, evaluation, bound)
    # Simple uniform (and one-wide-rest-narrow) tilings, balanced by exact time (``tilings``).
    world = request.cluster.world_size
    for tiled in best_tilings(problem, allowed, world, best.evaluation.step_s, budget, skip=sizes):
        best = _Candidate(tiled.layout, tiled.evaluation, bound)
    return _Candidate(best.layout, best.evaluation, bound)


def _searched_repack_sizing(
    problem: Problem,
    request: PlanRequest,
    base: _Candidate,
    sizes: list[int],
    members: list[list[int]],
    budget: Budget,
) -> _Candidate:
    """``repack+sizing``'s layout improved by the LNS (``_improved``); on memory-tight steps
    also each simple tiling's best layout, the fastest kept. Which start the LNS takes furthest
    is not the fastest start: on packed steps its heavy swaps gain most in parents of several
    ranks repacked into children of one, and a tiling of narrow parents, faster unrepacked, can
    win before the search and lose after it. Measured on 30 packed 64-GPU steps of 16-rank
    loader parents (2026-12-04): -26.25% -> -26.49% mean step time vs baseline, median gap
    4.27% -> 3.47%, p50 ~280 -> ~306 ms (two processes on two cores)."""
    sized = _repack_sizing(problem, request, base, sizes, members, budget)
    best = _improved(problem, sized.best, budget, "repack+sizing")
    if problem.fill < TIGHT_FILL or not searches(problem, budget):
        return best  # without the LNS (huge requests) a start's own layout is all it gives
    for start in sized.tilings:
        if budget.expired():
            break
        if start.layout == sized.best.layout:
            continue  # searched above
        other = _Candidate(start.layout, start.evaluation, sized.best.lower_bound_s)
        searched = _improved(problem, other, budget, "repack+sizing")
        if searched.evaluation.step_s < best.evaluation.step_s:
            best = searched
    return _searched_further(problem, best, budget, "repack+sizing")


def _repack_sizing(
    problem: Problem,
    request: PlanRequest,
    base: _Candidate,
    sizes: list[int],
    members: list[list[int]],
    budget: Budget,
) -> _Sized:
    """Sizes, membership and children together; never slower than ``repack+parent`` nor
    than ``sizing``. As in ``_repack_parent``, mode ``repack+parent`` is only solved when the
    sized layouts do not already beat its lower bound."""
    allowed = allowed_parent_sizes(request.cluster, request.model, uniform=False)
    bound = membership_free_bound(problem, allowed, repack=True)
    costs = (problem.cost, problem.costs)
    found: ChildrenSolution | None = None
    # A huge memory-tight request (no LNS: ``searches``) solves mode `repack+parent` first, in
    # full: the wall-clock safety net fires on such requests (a loader's packed 1,024-GPU
    # steps), and firing after this still leaves `repack+parent`'s layout, so the mode stays
    # never slower than it there too (before, 2 of 4 such steps ended 0.01-0.2% slower). The
    # same plans as the pruned order where nothing fires (``_sized_or_parent``).
    early: _Candidate | None = None
    if problem.fill >= TIGHT_FILL and not searches(problem, budget):
        early = _searched_parent(problem, sizes, members, budget, "repack+parent")
    floor_s = _pruning_floor(early)
    # Both estimates size parents: the exact unrepacked one (its membership is mode `sizing`'s,
    # same search range, and children can only speed it up) and the optimistic repacked one,
    # which a short request deadline (half the default or less) leaves out: it seldom wins.
    for objective in SIZING_OBJECTIVES[: budget.evals(len(SIZING_OBJECTIVES))]:
        if budget.expired():
            break
        below = min(floor_s, math.inf if found is None else found.evaluation.step_s)
        if objective == "baseline":
            # Mode `sizing`'s own sizing, over its whole range as that mode searches it: its
            # membership, children added, is never slower than that mode's layout of it. Cut
            # at `repack+parent`'s time, the bisection took other targets and ended 1.5%
            # slower (192 GPUs of 16-GPU nodes, 3,498 samples at 90%: `repack+sizing`
            # 1,037.3 ms against mode `sizing`'s 1,029.6; the 2026-12-07 evening fuzz).
            below = math.inf
        sized = _sized(problem, request, objective, base.evaluation.step_s, budget, below)
        if sized is not None:
            found = _faster(problem, sized, found, budget, floor_s)
    if budget.expired() and (found is not None or early is not None):
        return _Sized(_found_or_parent(found, early, bound))  # the safety net fired
    # Mode `sizing` also re-balances the upstream sizes by exact time: children on top of that,
    # unless no layout of the upstream sizes can beat what the sized ones found.
    # Any layout of the upstream sizes (re-balanced, or repack+parent's whole pipeline): the
    # node-level memory and split bounds prune it where the sized layouts already beat it.
    uniform_bound = max(
        membership_free_bound(problem, sizes, repack=True), sizes_bound(problem, sizes)
    )
    if not budget.expired() and (
        found is None or not _beyond(uniform_bound, found.evaluation.step_s)
    ):
        for rebalanced in _rebalanced(problem, sizes, members, budget):
            if budget.expired():
                break
            whole = evaluate(baseline_layout(sizes, rebalanced), *costs)
            if found is not None and found.evaluation.step_s <= whole.step_s:
                continue  # already at least as fast as mode `sizing` can be with it
            found = _faster(
                problem, SizedMembership(sizes, rebalanced, math.inf), found, budget, floor_s
            )
    # Children on the simple tilings mode `sizing` tries (``tilings``) that beat, unrepacked,
    # what is found so far: never slower than them, never solving hopeless ones.
    incumbent = base.evaluation.step_s if found is None else found.evaluation.step_s
    incumbent = min(incumbent, floor_s)
    world = request.cluster.world_size
    tiled_best = best_tilings(problem, allowed, world, incumbent, budget, TILINGS_REPACKED, sizes)
    tilings: list[ChildrenSolution] = []
    for i, tiled in enumerate(tiled_best):
        options = [tiled.members]
        if i == 0 and not budget.expired():  # the fastest: membership re-balanced for repacking
            moved = balance(problem, tiled.sizes, "repack", start=tiled.members, clock=budget)
            options.append(make_room(problem, tiled.sizes, moved, clock=budget))
        own: ChildrenSolution | None = None
        for option in options:
            own = _faster(
                problem, SizedMembership(tiled.sizes, option, math.inf), own, budget, floor_s
            )
        if own is not None:
            tilings.append(own)
            if found is None or own.evaluation.step_s < found.evaluation.step_s:
                found = own
    tried = [list(sizes), *(t.sizes for t in tiled_best)]
    best = _sized_or_parent(problem, sizes, members, found, uniform_bound, bound, budget, early)
    # Repacking can turn a tiling slow unrepacked (wide parents) into the fastest: the full
    # repack+parent pipeline on the most promising one by its repacked bound, pruned by it.
    # Last, so that a deadline that fires here still leaves repack+parent's layout.
    if (found is None and early is None) or budget.expired():
        return _Sized(best, tuple(tilings))
    for candidates in (
        candidate_tilings(problem, allowed, world, wide=False),
        wide_tilings(problem, allowed, world),
    ):
        if budget.expired():
            break
        wide = _wide_tiling(problem, candidates, best.evaluation.step_s, budget, tried)
        if wide is not None:
            parent = _repack_parent(problem, *wide, budget, best.evaluation.step_s)
            best = _faster_candidate(best, parent, bound)
    return _Sized(best, tuple(tilings))


def _pruning_floor(early: _Candidate | None) -> float:
    """The step time sized layouts must beat once mode ``repack+parent``'s layout is known
    (``early``): their children are only searched while they can (``_faster``'s ``floor_s``),
    which changes no answer (the faster of the two is kept), and the simple tilings must beat
    it unrepacked, like anything found so far (a heuristic cut: a tiling repacked could still
    win). Packed 1,024-GPU steps (`gpu64-packed.yaml`'s loader on 128 nodes, 10 steps):
    `repack+sizing` CPU -10 to -40% (p50 ~930 -> ~650 ms on a quiet 2-core machine), the
    same plans byte for byte."""
    return math.inf if early is None else early.evaluation.step_s


def _sized_or_parent(
    problem: Problem,
    sizes: list[int],
    members: list[list[int]],
    found: ChildrenSolution | None,
    uniform_bound: float,
    bound: float,
    budget: Budget,
    parent: _Candidate | None = None,
) -> _Candidate:
    """The sized layouts' best ``found`` or mode ``repack+parent``'s layout, whichever is
    faster; repack+parent is not solved when ``found`` already beats every layout of the
    upstream sizes. ``parent``: that layout, if already solved in full (where the pruning
    below would have skipped it, ``found`` is faster than it, so the answer is the same)."""
    if found is not None and found.evaluation.step_s <= uniform_bound:
        found = _polish_unless_searched(problem, found, budget)
        return _Candidate(found.layout, found.evaluation, bound)
    # Pruning mode `repack+parent` against the sized incumbent uses the bounds of its own three
    # memberships; the LNS moves samples beyond those, so where it runs, `repack+parent` is
    # solved in full and searched, which keeps repack+sizing never slower than repack+parent.
    incumbent = math.inf
    if found is not None and not searches(problem, budget):
        incumbent = found.evaluation.step_s
    best = parent
    if best is None:
        best = _searched_parent(problem, sizes, members, budget, "repack+parent", incumbent)
    if best is None or (found is not None and found.evaluation.step_s < best.evaluation.step_s):
        assert found is not None
        found = _polish_unless_searched(problem, found, budget)
        return _Candidate(found.layout, found.evaluation, bound)
    return _Candidate(best.layout, best.evaluation, bound, best.searched, best.settled)


def _found_or_parent(
    found: ChildrenSolution | None, parent: _Candidate | None, bound: float
) -> _Candidate:
    """``found`` where strictly faster than ``parent`` (or there is none), else ``parent``:
    ``_sized_or_parent``'s choice, for a safety net that fired before it."""
    if found is not None and (parent is None or found.evaluation.step_s < parent.evaluation.step_s):
        return _Candidate(found.layout, found.evaluation, bound)
    assert parent is not None  # one of the two is given
    return _Candidate(parent.layout, parent.evaluation, bound, parent.searched, parent.settled)


def _wide_tiling(
    problem: Problem,
    candidates: list[list[int]],
    incumbent_s: float,
    budget: Budget,
    tried: list[list[int]],
) -> tuple[list[int], list[list[int]]] | None:
    """The tiling of ``candidates`` with a parent at least a node wide (where node-local
    children gain most, so unrepacked time ranks it worst) not yet tried with the lowest
    repacked bound, if that bound can beat ``incumbent_s``, with its exact-time membership
    (``tilings``). The node-wide tiling counts: under a loader of wider parents it is often
    the fastest repacked (every parent one node, so its full layers' all-to-all stays inside
    it too). The caller picks one of the simple tilings, then one of the ``wide_tilings``
    (clusters whose ranks are not a power of two): ranked together, a wide tiling's low
    repacked bound took the place of the node-wide tiling that won (40 GPUs, [32, 4, 4]
    instead of [8] * 5: +1.4%)."""
    ranked = sorted(
        (membership_free_bound(problem, t, repack=True), t)
        for t in candidates
        if t not in tried and max(t) >= problem.cost.gpus_per_node
    )
    if not ranked or _beyond(ranked[0][0], incumbent_s):
        return None
    members = tiling_memberships(problem, ranked[0][1], budget)
    if not members:
        return None
    return ranked[0][1], members[0]


def _polish_unless_searched(
    problem: Problem, solution: ChildrenSolution, budget: Budget
) -> ChildrenSolution:
    """CP-SAT polish of the critical parent's children, unless the LNS (``_improved``) runs on
    this layout next: its moves re-solve the critical parent's children together with its
    membership, and on the packed 64-GPU trace the polish before it changed the 200 steps'
    summed step time by 0.002% for 8% of `repack+parent`'s CPU (30.6 -> 28.2 s in all).
    Its bounds are not used on these paths (the candidates carry membership-free bounds)."""
    return solution if searches(problem, budget) else polish(problem, solution, budget)


def _faster_candidate(best: _Candidate, other: _Candidate | None, bound: float) -> _Candidate:
    """``other`` (already polished, not searched) where strictly faster than ``best``."""
    if other is not None and other.evaluation.step_s < best.evaluation.step_s:
        return _Candidate(other.layout, other.evaluation, bound)
    return best


def _improved(problem: Problem, best: _Candidate, budget: Budget, mode: str) -> _Candidate:
    """The pipeline's layout improved by LNS on the joint model (``membership_lns``, with the
    mode's ``search_scale``), then by sample swaps between children (``child_swaps``: what
    memory-full children still allow); same bound, since the bound holds for any membership."""
    if best.searched:
        return best
    layout, evaluation = _search_round(problem, best, budget, mode)
    return _Candidate(layout, evaluation, best.lower_bound_s, searched=True)


def _search_round(
    problem: Problem, best: _Candidate, budget: Budget, mode: str, scale: float | None = None
) -> tuple[Layout, LayoutEval]:
    """One round of ``_improved``: LNS, child swaps, per-node child sizes."""
    lns = improve(
        problem,
        best.layout,
        best.evaluation,
        budget,
        best.lower_bound_s,
        scale or search_scale(problem, mode),
    )
    layout, evaluation = lns.layout, lns.evaluation
    # At its lower bound no swap can make the step faster (at 1,024 GPUs `repack+parent` ends
    # there on most bench steps, and the swaps spent 40-90 ms proving it).
    if not budget.expired() and evaluation.step_s > best.lower_bound_s:
        swapped = swap_children(problem, layout, budget)
        if swapped is not layout:
            after = evaluate(swapped, problem.cost, problem.costs)
            if after.step_s < evaluation.step_s:
                layout, evaluation = swapped, after
    if evaluation.step_s > best.lower_bound_s:
        sized = resized(problem, layout)
        if sized is not layout:
            after = evaluate(sized, problem.cost, problem.costs)
            if after.step_s < evaluation.step_s:
                layout, evaluation = sized, after
    return layout, evaluation


def _searched_further(problem: Problem, best: _Candidate, budget: Budget, mode: str) -> _Candidate:
    """A searched layout of a memory-tight step, searched again while a round gains (at most
    ``TIGHT_ROUNDS`` more): the swaps of full children open LNS moves the first round had
    run out of, and the other way round. Only the mode's final layout gets them (the starts
    of ``repack+sizing``'s multi-start do not: each round costs ~35 ms at 64 GPUs)."""
    if (
        best.settled
        or problem.fill < TIGHT_FILL
        or problem.cost.world_size > ROUNDS_MAX_RANKS
        or not searches(problem, budget)
    ):
        return best
    for _ in range(TIGHT_ROUNDS):
        if budget.expired() or best.evaluation.step_s <= best.lower_bound_s:
            break
        layout, evaluation = _search_round(problem, best, budget, mode, FURTHER_SCALE)
        gained = evaluation.step_s <= best.evaluation.step_s * (1 - MIN_GAIN)
        if evaluation.step_s < best.evaluation.step_s:
            best = _Candidate(layout, evaluation, best.lower_bound_s, searched=True)
        if not gained:
            break
    return _Candidate(best.layout, best.evaluation, best.lower_bound_s, True, settled=True)


def _faster(
    problem: Problem,
    sized: SizedMembership,
    found: ChildrenSolution | None,
    budget: Budget,
    floor_s: float = math.inf,
) -> ChildrenSolution | None:
    """The greedy children of ``sized`` if faster than ``found`` (the first candidate if none).
    Only a faster layout replaces the incumbent, so the children of a membership whose bound
    says it cannot be are not searched, and the search stops once one parent is too slow.
    ``floor_s``: a layout found elsewhere that the caller keeps unless beaten (mode
    ``repack+parent``'s, solved first on huge memory-tight requests); children that cannot
    beat it are not searched either, and ``found`` (possibly None) stays."""
    if found is None and floor_s == math.inf:
        return solve_children(problem, sized.sizes, sized.members, budget)
    incumbent = min(floor_s, math.inf if found is None else found.evaluation.step_s)
    bounds = membership_bounds(problem, sized.sizes, sized.members)
    if _beyond(max(bounds), incumbent):
        return found
    limit = incumbent * (1 + BOUND_SLACK)
    candidate = children_below(problem, sized.sizes, sized.members, budget, limit, bounds)
    if candidate is not None and candidate.evaluation.step_s < incumbent:
        return candidate
    return found


def _beyond(bound_s: float, incumbent_s: float) -> bool:
    """Whether a lower bound shows that nothing it bounds can be faster than, or as fast as,
    ``incumbent_s``, float noise between bound and evaluation included: pruning on it leaves
    every comparison between candidates, ties included, as if the candidate had been solved."""
    return bound_s > incumbent_s * (1 + BOUND_SLACK)


def _outcome(best: _Candidate, base: LayoutEval, budget: Budget) -> SolveOutcome:
    step = best.evaluation.step_s
    if best.lower_bound_s > step * (1 + BOUND_SLACK):
        # A bound above a feasible plan is a bug in bounds.py, never a property of the input.
        raise AssertionError(f"lower bound {best.lower_bound_s} s above the plan's {step} s")
    lb = min(best.lower_bound_s, step)  # equal up to float noise
    proven = step - lb <= GAP_TOLERANCE * step
    # The safety net is reported whenever it fired: the layout may then depend on the machine.
    stopped: StoppedBy = "deadline" if budget.fired else ("optimal" if proven else "work_limit")
    return SolveOutcome(
        layout=best.layout,
        evaluation=best.evaluation,
        baseline=base,
        lower_bound_s=lb,
        status="optimal" if proven else "feasible",
        stopped_by=stopped,
    )
