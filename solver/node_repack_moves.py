"""Moves that re-pack a node: a sample of the critical parent's slowest child to another of
its nodes, whose children are packed again from scratch (``children_of_segment``).

The child swaps trade samples between children as they are. When every child of the receiving
node is a little short of memory for the sample (children of 2 ranks each ~2,300 tokens short
of a 5,585-token sample, while the node has 9,000 tokens free), no swap takes it, and the
critical child keeps it; packed again with it, the node holds it. This is the move the tests'
reference heuristic makes on every try, here made from the finished layout, with the
membership kept (mode ``repack``), on small requests only (``repacks_nodes``): each try
packs a node.

Where no sample of the slowest child moves with gain, the node of the parent's busiest rank
(which its full layers wait for) gives one sample to another node and both are packed again
(``_busiest_move``): ranks level at the top all drop at once, which no single move between
children as they are can do.
"""

from __future__ import annotations

from solver.budget import Budget, WorkPool
from solver.cost_model import child_layer_seconds
from solver.critical import first_max
from solver.layout import Child, Layout, Parent, parent_time
from solver.node_membership import small_request
from solver.node_packing import children_of_segment
from solver.problem import Problem

REPACK_TRIES = 400
"""Node re-packs per request at the full work budget (``Budget.move_evals``), about 0.2 ms
each on a 32-GPU request; a node of more than ``REPACK_SAMPLES`` samples is charged one more
try per ``REPACK_SAMPLES`` (``_charge``)."""
REPACK_SAMPLES = 128
"""Samples of a node re-pack charged as one try: a re-pack costs about its sample count (an
LPT), so a node of many short samples is charged as many re-packs. Charged per try, 24 GPUs of
three 8-rank parents with 1,284 samples (~430 a node; the 2026-12-07 evening fuzz) spent 2.2 s
of CPU here, 10x a hunted 32-GPU step's; the hunted steps' nodes hold up to ~90 samples, so
they are charged as before."""
IMPROVEMENT = 1e-9
"""Relative drop of the critical parent a move must reach (float noise is not a gain)."""
SMALL_WORLD = 32
"""Requests of at most this many ranks get these moves whatever their sample count; larger
ones only when ``node_membership.small_request``. A packed 32-GPU step of four 8-rank parents
on 4-GPU nodes (312 samples: 2,496 sample x node-bin pairs, above ``small_request``'s 2,000)
ended mode ``repack`` 0.20% behind the tests' reference heuristic without them and 0.16% ahead
with them, for ~0.16 s more CPU (0.30 -> 0.46 s; a hunt, 2026-12-06 night)."""


def repacks_nodes(problem: Problem, sizes: list[int]) -> bool:
    """Whether a layout of parents ``sizes`` is finished by these moves."""
    return problem.cost.world_size <= SMALL_WORLD or small_request(problem, sizes)


def _charge(members: list[int]) -> int:
    """Tries one node re-pack of ``members`` is charged (``REPACK_SAMPLES``)."""
    return -(-len(members) // REPACK_SAMPLES)


def _nodes(problem: Problem, parent: Parent) -> dict[int, list[Child]]:
    g = problem.cost.gpus_per_node
    nodes: dict[int, list[Child]] = {}
    for child in parent.children:
        nodes.setdefault(child.start // g, []).append(child)
    return nodes


def _move(problem: Problem, parent: Parent, tries: list[int], limit: int) -> Parent | None:
    """The first move out of the parent's slowest child that makes the parent faster."""
    cost, costs, g = problem.cost, problem.costs, problem.cost.gpus_per_node
    now = parent_time(parent, cost, costs)
    nodes = _nodes(problem, parent)
    slowest = max(
        parent.children,
        key=lambda c: (
            child_layer_seconds(
                cost,
                c.size,
                sum(problem.sparse_s[s] for s in c.samples),
                sum(problem.tokens[s] for s in c.samples),
            ),
            -c.start,
        ),
    )
    home = slowest.start // g
    for a in sorted(slowest.samples, key=problem.heavy_rank.__getitem__):
        for node, kids in sorted(nodes.items()):
            if node == home:
                continue
            if tries[0] >= limit:
                return None
            members = [s for c in kids for s in c.samples] + [a]
            tries[0] += _charge(members)
            start = min(c.start for c in kids)
            ranks = sum(c.size for c in kids)
            packed = children_of_segment(problem, start, ranks, members, parent.size)
            if packed is None:
                continue
            children: list[Child] = []
            for c in parent.children:
                if c.start // g == node:
                    continue
                if c is slowest:
                    c = Child(c.start, c.size, tuple(s for s in c.samples if s != a))
                children.append(c)
            children += packed[0]
            children.sort(key=lambda c: c.start)
            moved = Parent(parent.start, parent.size, tuple(children))
            if parent_time(moved, cost, costs) < now * (1 - IMPROVEMENT):
                return moved
    return None


def _busiest_move(problem: Problem, parent: Parent, tries: list[int], limit: int) -> Parent | None:
    """The first move out of the node of the parent's busiest rank (its full layers wait for
    that rank) to another node that makes the parent faster, both nodes packed again. Where
    that node's ranks are level at the top, no move of one sample between children lowers
    them all; one fewer sample on the node, packed again, does (a 16-rank parent of a child of
    8 on one node and eight full children of 1 on the other: 0.14% behind the tests'
    reference, which packs a bin again after every move)."""
    cost, costs, g = problem.cost, problem.costs, problem.cost.gpus_per_node
    now = parent_time(parent, cost, costs)
    nodes = _nodes(problem, parent)
    busiest = max(
        parent.children,
        key=lambda c: (-(-sum(problem.tokens[s] for s in c.samples) // c.size), -c.start),
    )
    home = busiest.start // g
    home_kids = nodes[home]
    home_start = min(c.start for c in home_kids)
    home_ranks = sum(c.size for c in home_kids)
    home_members = [s for c in home_kids for s in c.samples]
    for a in sorted(home_members, key=problem.heavy_rank.__getitem__):
        rest = [s for s in home_members if s != a]
        left: tuple[list[Child], float, int] | None = None
        for node, kids in sorted(nodes.items()):
            if node == home:
                continue
            if tries[0] >= limit:
                return None
            members = [s for c in kids for s in c.samples] + [a]
            tries[0] += _charge(members)
            start = min(c.start for c in kids)
            packed = children_of_segment(
                problem, start, sum(c.size for c in kids), members, parent.size
            )
            if packed is None:
                continue
            if left is None:  # the home node without ``a``, packed once per sample
                left = children_of_segment(problem, home_start, home_ranks, rest, parent.size)
                if left is None:
                    break
            children = [c for c in parent.children if c.start // g not in (node, home)]
            children += packed[0] + left[0]
            children.sort(key=lambda c: c.start)
            moved = Parent(parent.start, parent.size, tuple(children))
            if parent_time(moved, cost, costs) < now * (1 - IMPROVEMENT):
                return moved
    return None


def repack_moves(
    problem: Problem, layout: Layout, budget: Budget, pool: WorkPool | None = None
) -> Layout:
    """``layout`` with node re-packing moves inside its critical parent while it gets faster
    (membership and parent sizes kept); the same object when no move helps. ``pool``: the
    tries are also drawn from it."""
    limit = budget.move_evals(REPACK_TRIES)
    if pool is not None:
        limit = pool.cap("node_repack_moves", limit)
    tries = [0]
    try:
        return _repacked(problem, layout, budget, limit, tries)
    finally:
        if pool is not None:
            pool.charge("node_repack_moves", tries[0])


def _repacked(
    problem: Problem, layout: Layout, budget: Budget, limit: int, tries: list[int]
) -> Layout:
    out = list(layout)
    changed = False
    while tries[0] < limit and not budget.expired():
        times = [parent_time(par, problem.cost, problem.costs) for par in out]
        j = first_max(times)
        parent = out[j]
        if not parent.repacked or parent.size <= problem.cost.gpus_per_node:
            break
        moved = _move(problem, parent, tries, limit)
        if moved is None:  # the slowest child's samples stay: the busiest rank's node next
            moved = _busiest_move(problem, parent, tries, limit)
        if moved is None:
            break
        out[j], changed = moved, True
    return tuple(out) if changed else layout
