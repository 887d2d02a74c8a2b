"""Large-neighbourhood search on the joint membership + children model (``joint_model``).

The greedy pipeline's layout is the incumbent. Each move frees a neighbourhood and re-solves it
with CP-SAT (one worker, fixed seed, a deterministic work limit from ``Budget.cpsat_seconds``),
with the incumbent as the complete hint; the result is accepted only if the exact evaluator
(``layout.evaluate``) finds it faster (first improvement: the neighbourhoods of the new
incumbent are then tried from the top). Neighbourhoods, most promising first, between the
critical parent and the ``SLACK_PARENTS`` fastest parents:

* ``heavy``: one of the critical parent's longest samples, a few short samples of its child,
  and the fastest child of a slack parent that could hold it. Packed loaders leave no memory
  anywhere, so a long (attention-heavy) sample can only leave if short ones take its place:
  a subset-sum CP-SAT settles in a few milliseconds. Nearly every accepted move on the packed
  trace is one of these;
* ``exchange``: a whole child of the critical parent against the fastest children of the
  slack parents;
* ``node``: the critical parent's slowest node with its child sizes re-chosen from the menu
  (8x1/4x2/2x4/1x8), plus the samples of the slack parents' fastest children;
* ``swap``: single samples, the critical parent's longest against the slack parents' shortest;
* ``longest``: the longest samples of the step between every parent they may move to.

The neighbourhoods depend only on the incumbent and the request, so the search is
deterministic. Requests with more than ``MAX_SAMPLES`` samples or ``MAX_WORLD`` ranks skip the
search (the 1,024-GPU latency budget has no room for it), as do layouts already within
``SETTLED_GAP`` of their bound: the greedy pipeline stays their answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from solver.budget import Budget
from solver.cost_model import child_layer_seconds, parent_seconds
from solver.critical import first_max
from solver.joint_model import JointModel, Neighbourhood, freed_samples, node_of, unsplit
from solver.layout import Child, Layout, LayoutEval, Parent, evaluate
from solver.node_membership import TIGHT_FILL
from solver.problem import Problem

MOVE_SECONDS = 0.0015
"""CP-SAT deterministic seconds per move at most, at the full work budget. Small models solved
often beat large ones solved long: on the packed trace nearly every accepted move is a heavy
swap (~30 samples, proven optimal in ~0.0008 s), and the number of moves decides the quality."""

LNS_SECONDS = 0.006
"""The whole search's deterministic budget at the full work budget (``Budget.cpsat_seconds``):
each move is charged the deterministic time CP-SAT spent plus ``MOVE_CHARGE`` for building its
model in Python, so cheap moves buy more moves. Sized so that the search adds a few tens of ms
of CPU at 64 GPUs; multiplied by ``SEARCH_SCALE`` per mode."""

MOVE_CHARGE = 0.0008
"""Deterministic-second equivalent of building and evaluating one move (~2-4 ms of CPU)."""

MAX_MOVES = 6
"""Moves per request at most (``Budget.evals``), times ``SEARCH_SCALE``; fewer when a whole
list of neighbourhoods fails or the deterministic budget is spent."""

SEARCH_SCALE = {"repack+parent": 2.0, "repack+sizing": 1.0}
"""Both budgets above per mode. ``repack+parent`` (a loader's sizes kept: its only lever is
membership) gets 5x: measured on an idle 2-core machine, 1x / 4x / 6x / 10x gave -14.65 /
-14.91 / -15.01 / -15.12% on the packed trace's wide steps for a 64-GPU p99 of 88 / 166 / 172 /
230 ms (target 200 ms). It was 6x until the node stage's LPT counted full attention
(2026-12-01), then 4x (0.02-0.05 points less on the packed traces' wide steps, ~20% less CPU),
which left step 50 of ``scenarios/gpu64-packed.yaml`` 0.12% slower than the tests' reference
heuristic (4180.1 vs 4175.1 ms; its node stage ends 1.6% behind the reference there, and the
LNS at 4x stops just short): 4.5x and 5x reach 4143.8 / 4139.5 ms (-0.85%), and 5x is the
margin kept (wide steps -17.16% -> -17.20%, mean of per-step changes; CPU +10%).
Since 2026-12-06 that 5x is for memory-tight steps only (``TIGHT_SEARCH_SCALE``, where it
was measured); on steps with memory to spare ``repack+parent`` gets 2x: there the LNS gains
little beyond 2x, and the 64-GPU p99 is set by the steps that also compute mode ``repack``'s
answer (``planner._searched_parent``). ``repack bench --sizes 64:400``, seeds 0 / 1 / 2, 5x ->
3x -> 2x: mean step time -7.920 -> -7.912 -> -7.904%, -10.175 -> -10.163 -> -10.164%,
-11.960 -> -11.953 -> -11.936%; p99 241 -> 224 -> 170, 219 -> 205 -> 172, 272 -> 200 -> 196 ms
(one process, 2-core machine); the 18 wide steps of ``gpu64-200steps.yaml`` -24.693 ->
-24.693 -> -24.690%.
``repack+sizing`` (the service's default mode) stays at 1x: 6x gained 0.1-0.2 points there
and doubled the service's CPU per plan (in-process p50 26 -> 55 ms, answers/s at 8 loaders
67 -> 27)."""

TIGHT_SEARCH_SCALE = {"repack+parent": 5.0, "repack+sizing": 2.0}
"""``SEARCH_SCALE`` for memory-tight steps (``node_membership.TIGHT_FILL``: a packing loader's).
There the LNS is a small part of ``repack+sizing``'s CPU (the tilings' fills and node stages
are most of it) and buys more: measured 2026-12-03 (after children filled to the token), 1x /
3x / 5x gave -26.2 / -26.3 / -26.4% on 30 packed 64-GPU steps of 16-rank loader parents
(median gap 4.04 / 3.83 / 3.49%), p99 573 / 524 / 543 ms, and on the packed scenario's wide
steps 5844.3 -> 5839.4 ms (p99 657 -> 646 ms: within noise). On ``repack bench``'s 60%-fill
64-GPU steps 5x took p50 61 -> 99 ms, p99 107 -> 169 ms for -10.96 -> -11.00%: those keep 1x.
Since 2026-12-04 ``repack+sizing`` searches from every simple tiling's start on these steps
(``planner._searched_repack_sizing``), each start at this scale: 1x / 2x / 5x gave -26.39 /
-26.46 / -26.49% on the same 30 steps (median gap 3.49 / 3.49 / 3.47%), p50 227 / 268 / 347 ms
(two processes on two cores), so 2x."""


def search_scale(problem: Problem, mode: str) -> float:
    """The LNS budget's multiple for ``mode`` on this request."""
    table = TIGHT_SEARCH_SCALE if problem.fill >= TIGHT_FILL else SEARCH_SCALE
    return table[mode]


MIN_GAIN = 1e-5
"""Relative step-time gain a move must bring to be taken. Smaller gains used the budget up:
on step 11 of `gpu64-200steps.yaml` every move of the search was a heavy swap worth 1e-6 of
the step (taken, so the list started again from the top), and the step ended 0.07% behind the
tests' reference heuristic; with this floor the same budget reached larger moves (3795.0 ->
3776.7 ms, 0.42% ahead of the reference)."""

SETTLED_GAP = 0.005
"""No search on a layout this close (relative) to its lower bound."""

MAX_PAIRS = 1_600
"""Largest neighbourhood, in sample-to-bin booleans: building a bigger model in Python costs
more latency than the move can win."""

MAX_SAMPLES = 3_000
MAX_WORLD = 256
"""Requests above either size keep the greedy pipeline's layout. 256 GPUs since 2026-12-02
(was 128 GPUs / 1,500 samples): on 5 packed 256-GPU wide steps (the loader of
``scenarios/gpu64-packed.yaml`` on 32 nodes, seed 12) `repack+parent` -0.35% mean step time
(one step -1.35%), `repack+sizing` -0.61% (median gap 5.18% -> 3.91%); on 6 bench steps
(256:1500) -0.22% / -0.05%; CPU +16-30% at the median. At 1,024 GPUs it is not worth its
latency (the node stage ends those steps at their bound)."""

SLACK_PARENTS = 2
EXCHANGES = 3
"""Children of the critical parent offered for exchange (slowest first)."""
HEAVY = 3
"""Longest samples of the critical parent offered for a heavy swap."""
A_SHORT = 4
"""Short samples of the heavy sample's child that may leave with it or take its place."""
PARTNERS = 1
"""Exchange partners per slack parent: its fastest, then second fastest, child."""
LONGEST = 4
MENU_BINS = 15
"""Slots of a freed 8-GPU node's menu (8x1 + 4x2 + 2x4 + 1x8), for sizing neighbourhoods."""


@dataclass(frozen=True)
class LnsResult:
    layout: Layout
    evaluation: LayoutEval
    moves: int
    accepted: tuple[str, ...]
    """Kinds of the accepted moves, in order."""


def searches(problem: Problem, budget: Budget) -> bool:
    """Whether the LNS runs for this request at all: CP-SAT on, and not a huge request (the
    greedy path alone keeps those within their latency)."""
    return (
        budget.use_cpsat
        and problem.num_samples <= MAX_SAMPLES
        and problem.cost.world_size <= MAX_WORLD
    )


def improve(
    problem: Problem,
    layout: Layout,
    evaluation: LayoutEval,
    budget: Budget,
    lower_bound_s: float = 0.0,
    scale: float = 1.0,
) -> LnsResult:
    """The incumbent improved by LNS: the neighbourhoods of the incumbent are tried in order
    until one improves it (first improvement), then the list is rebuilt for the new incumbent;
    the search ends when a whole list fails, after ``scale x MAX_MOVES`` solves, or at the
    budget (``scale x LNS_SECONDS``)."""
    if (
        not searches(problem, budget)
        or len(layout) < 2
        or evaluation.step_s <= lower_bound_s * (1 + SETTLED_GAP)
    ):
        return LnsResult(layout, evaluation, 0, ())
    moves = 0
    accepted: list[str] = []
    improved = True
    start = layout
    # The search compares parent times only (plain sums, one per changed parent); the whole
    # evaluation (numpy sums, inter-node bytes) is done once, for the layout it returns.
    times = tuple(_parent_seconds(problem, par) for par in layout)
    searched = LayoutEval(max(times), times, evaluation.inter_node_bytes, evaluation.imbalance)
    shares: dict[tuple[float, int], list[int]] = {}
    exact: dict[int, tuple[Parent, float]] = {}
    max_moves = budget.evals(round(MAX_MOVES * scale))
    left = budget.cpsat_seconds(LNS_SECONDS * scale)
    while improved and moves < max_moves and left > 0 and not budget.expired():
        improved = False
        for hood in _neighbourhoods(problem, layout, searched):
            if moves >= max_moves or left <= 0 or budget.expired():
                break
            moves += 1
            try:
                model = JointModel(problem, layout, hood, shares, exact)
            except ValueError:
                continue
            limit = min(budget.cpsat_seconds(MOVE_SECONDS), left)
            result = model.solve(limit, budget.remaining_s())
            left -= result.work_s + budget.cpsat_seconds(MOVE_CHARGE)
            if result.stopped_by_time:
                budget.fired = True
            found = result.layout
            if found is None:
                continue
            new = _reevaluate(problem, found, searched, hood)
            if _better(new, searched):
                layout, searched = found, new
                accepted.append(hood.kind)
                improved = True
                break
    if layout is not start:
        evaluation = evaluate(layout, problem.cost, problem.costs)
    return LnsResult(layout, evaluation, moves, tuple(accepted))


def _reevaluate(
    problem: Problem, layout: Layout, old: LayoutEval, hood: Neighbourhood
) -> LayoutEval:
    """The search's step time of a move's layout: only the neighbourhood's parents changed.
    Only ``step_s`` and ``parent_s`` are the move's; ``improve`` evaluates the layout it
    returns in full."""
    times = list(old.parent_s)
    for j in hood.parents:
        times[j] = _parent_seconds(problem, layout[j])
    return LayoutEval(max(times), tuple(times), old.inter_node_bytes, old.imbalance)


def _better(new: LayoutEval, old: LayoutEval) -> bool:
    """A step faster by at least ``MIN_GAIN``, or no slower with fewer parents within
    ``MIN_GAIN`` of it (progress for min-max when several parents share the step time)."""
    if new.step_s < old.step_s * (1 - MIN_GAIN):
        return True
    if new.step_s > old.step_s * (1 + 1e-12):
        return False
    near = old.step_s * (1 - MIN_GAIN)
    return sum(t >= near for t in new.parent_s) < sum(t >= near for t in old.parent_s)


def _child_seconds(problem: Problem, child: Child) -> float:
    """One sparse layer of ``child`` (plain sums: faster than numpy on a few samples)."""
    sparse = sum(problem.sparse_s[s] for s in child.samples)
    tokens = sum(problem.tokens[s] for s in child.samples)
    return child_layer_seconds(problem.cost, child.size, sparse, tokens)


def _parent_seconds(problem: Problem, par: Parent) -> float:
    """``layout.parent_time`` with plain sums (the exact cost model, same terms)."""
    sp, tok = problem.sparse_s, problem.tokens
    terms = [
        (c.size, sum(sp[s] for s in c.samples), sum(tok[s] for s in c.samples))
        for c in par.children
    ]
    full = sum(problem.full_s[s] for c in par.children for s in c.samples)
    return parent_seconds(problem.cost, par.size, full, terms)


def _neighbourhoods(
    problem: Problem, layout: Layout, evaluation: LayoutEval
) -> Iterator[Neighbourhood]:
    """The incumbent's neighbourhoods, most promising first (see the module docstring)."""
    times = evaluation.parent_s
    crit = first_max(times)
    slack = sorted((j for j in range(len(layout)) if j != crit), key=lambda j: (times[j], j))
    slack = slack[:SLACK_PARENTS]
    parents = sorted({crit, *slack})
    crit_kids = sorted(
        (c for c in layout[crit].children if c.samples),
        key=lambda c: (-_child_seconds(problem, c), c.start),
    )
    fast = [
        sorted(
            (c for c in layout[j].children if c.samples),
            key=lambda c: (_child_seconds(problem, c), c.start),
        )
        for j in slack
    ]
    # Heavy swaps: one long sample of the critical parent out, room made by short ones in.
    tok = problem.tokens
    cap = problem.cost.max_tokens_per_rank
    heavy = sorted(
        ((s, a) for a in crit_kids for s in a.samples),
        key=lambda sa: (-tok[sa[0]], sa[0]),
    )
    for s, a in heavy[:HEAVY]:
        partners = [
            (j, c)
            for j, kids in zip(slack, fast, strict=True)
            for c in kids[:PARTNERS]
            if c.size * cap >= tok[s]
        ][:PARTNERS]
        if not partners:
            continue
        short = sorted((x for x in a.samples if x != s), key=lambda x: (tok[x], x))[:A_SHORT]
        samples = {s, *short}.union(*(c.samples for _, c in partners))
        targets = ((crit, a.start), *((j, c.start) for j, c in partners))
        yield Neighbourhood(tuple(parents), tuple(sorted(samples)), (), targets, "heavy")
    # Exchanges: a child of the critical parent against the fastest children of the others.
    for a in crit_kids[:EXCHANGES]:
        for r in range(PARTNERS):
            partners = [(j, kids[r]) for j, kids in zip(slack, fast, strict=True) if r < len(kids)]
            if not partners:
                continue
            samples = set(a.samples).union(*(c.samples for _, c in partners))
            targets = ((crit, a.start), *((j, c.start) for j, c in partners))
            yield Neighbourhood(tuple(parents), tuple(sorted(samples)), (), targets, "exchange")
    # The critical parent's slowest node re-chosen, with room from the fastest children.
    targets = tuple((j, kids[0].start) for j, kids in zip(slack, fast, strict=True) if kids)
    extra = [s for j, kids in zip(slack, fast, strict=True) if kids for s in kids[0].samples]
    yield _grow(
        problem,
        layout,
        parents,
        iter(_nodes_by_time(problem, layout, crit)[:1]),
        iter(extra),
        targets,
        "node",
    )
    # Swaps of single samples: the critical parent's longest against the others' shortest.
    yield _grow(
        problem,
        layout,
        parents,
        iter(()),
        _critical_singles(problem, layout, crit, slack),
        None,
        "swap",
    )
    # The longest samples of the step, between every parent they may move to.
    longest = sorted(range(problem.num_samples), key=lambda s: (-problem.tokens[s], s))
    where = {s: j for j, par in enumerate(layout) for s in par.samples}
    chosen = longest[:LONGEST]
    with_longest = sorted({*parents, *(where[s] for s in chosen)})
    yield _grow(problem, layout, with_longest, iter(()), iter(chosen), None, "longest")


def _nodes_by_time(problem: Problem, layout: Layout, j: int) -> list[tuple[int, int]]:
    """Nodes of parent ``j``, slowest child first (all of them for an unrepacked wide
    parent, which is one bin)."""
    cost = problem.cost
    par = layout[j]
    g = min(par.size, cost.gpus_per_node)
    if unsplit(problem, par):
        return [(j, n) for n in range(par.size // g)]
    slowest: dict[int, float] = {}
    for c in par.children:
        n = node_of(par, c, g)
        slowest[n] = max(slowest.get(n, 0.0), _child_seconds(problem, c) if c.samples else 0.0)
    return [(j, n) for n in sorted(slowest, key=lambda n: (-slowest[n], n))]


def _critical_singles(
    problem: Problem, layout: Layout, crit: int, slack: list[int]
) -> Iterator[int]:
    """The critical parent's samples longest first, interleaved with the slack parents'
    shortest (a long one out needs short ones to make room)."""
    tok = problem.tokens
    out = sorted(layout[crit].samples, key=lambda s: (-tok[s], s))
    short = sorted((s for j in slack for s in layout[j].samples), key=lambda s: (tok[s], s))
    for a in range(max(len(out), len(short))):
        if a < len(out):
            yield out[a]
        if a < len(short):
            yield short[a]


def _grow(
    problem: Problem,
    layout: Layout,
    parents: list[int],
    nodes: Iterator[tuple[int, int]],
    singles: Iterator[int],
    targets: tuple[tuple[int, int], ...] | None,
    kind: str,
) -> Neighbourhood:
    """Nodes first, then single samples, while the model stays under ``MAX_PAIRS``."""
    g_all = problem.cost.gpus_per_node
    bins = sum(len(layout[j].children) for j in parents) if targets is None else len(targets) + 1
    freed: list[tuple[int, int]] = []
    samples: set[int] = set()
    for node in nodes:
        if node in freed:
            continue
        par = layout[node[0]]
        g = min(par.size, g_all)
        wide = unsplit(problem, par)  # frees all its nodes at once
        group = [(node[0], n) for n in range(par.size // g)] if wide else [node]
        extra = freed_samples(problem, layout, group)
        new_bins = bins + MENU_BINS * len(group) + 1
        if len(samples | extra) * new_bins > MAX_PAIRS:
            continue
        freed.extend(group)
        samples |= extra
        bins = new_bins
    for s in singles:
        if s in samples:
            continue
        if (len(samples) + 1) * bins > MAX_PAIRS:
            break
        samples.add(s)
    freed_nodes = tuple(sorted(set(freed)))
    return Neighbourhood(tuple(parents), tuple(sorted(samples)), freed_nodes, targets, kind)
