"""Child sizes chosen per node for the parent's time, not for the node alone.

The node stage (``node_packing.children_of_segment``) gives every node the uniform child size
whose packing scores best *for that node*: its sparse-layer time plus its busiest rank's
tokens at the full layers' per-token price. But a parent's full layers wait for the busiest
rank of the *whole* parent and its sparse layers for the slowest child of any node: a node
whose busiest rank is below another node's gains nothing from a wider child that lowers it,
and loses the faster sparse layers of narrower children. (A 2 x 4-GPU parent full to 99%:
one node took a child of 4 for its lower busiest rank, the other node's two children of 2
already set the parent's busiest rank; two children of 2 on both nodes were 0.4% faster, which
is what the tests' reference heuristic, choosing by sparse time, found.)

``resized`` re-chooses each node's children of a repacked parent among what it has and the LPT
packing of its samples at every child size, by the parent's exact time with the other nodes
as they are (coordinate descent, a few rounds), and keeps the result where the parent gets
faster. Samples never leave their node, so memory and membership are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

from solver.cost_model import ceil_div, child_layer_seconds, full_layer_seconds
from solver.layout import Child, Layout, Parent, parent_time
from solver.node_packing import packed_children
from solver.problem import Problem

ROUNDS = 3
"""Passes over a parent's nodes; each pass changes a node only when the parent gets faster,
so the descent stops once a pass changes nothing (two passes on every case measured)."""

_Option = tuple[tuple[Child, ...], float, int]
"""A node's children, their slowest sparse layer and their busiest rank's tokens."""


def resized(problem: Problem, layout: Layout) -> Layout:
    """``layout`` with every repacked parent's per-node child sizes re-chosen for the parent's
    time; the same object when no parent gets faster."""
    out = list(layout)
    changed = False
    for i, parent in enumerate(layout):
        better = _resized_parent(problem, parent)
        if better is not None:
            out[i], changed = better, True
    return tuple(out) if changed else layout


def _resized_parent(problem: Problem, parent: Parent) -> Parent | None:
    if not parent.repacked:
        return None
    cost, g = problem.cost, problem.cost.gpus_per_node
    nodes: dict[int, list[Child]] = {}
    for child in parent.children:
        nodes.setdefault(child.start // g, []).append(child)
    options = [_options(problem, parent.size, kids) for kids in nodes.values()]
    if all(len(o) == 1 for o in options):
        return None
    full_s = sum(problem.full_s[s] for s in parent.samples)

    def seconds(chosen: Sequence[_Option]) -> float:
        z = max(o[1] for o in chosen)
        m = max(o[2] for o in chosen)
        return (
            cost.full_layers * full_layer_seconds(cost, parent.size, full_s, m)
            + cost.sparse_layers * z
        )

    chosen = [node_options[0] for node_options in options]
    best = seconds(chosen)
    start = best
    for _ in range(ROUNDS):
        moved = False
        for b, node_options in enumerate(options):
            for option in node_options:
                if option is chosen[b]:
                    continue
                trial = [*chosen[:b], option, *chosen[b + 1 :]]
                t = seconds(trial)
                if t < best * (1 - 1e-12):
                    chosen, best, moved = trial, t, True
        if not moved:
            break
    if best >= start * (1 - 1e-12):
        return None
    children = tuple(sorted((c for o in chosen for c in o[0]), key=lambda c: c.start))
    out = Parent(parent.start, parent.size, children)
    # The exact evaluation decides (the descent's sums are the cost model's, up to rounding).
    if parent_time(out, cost, problem.costs) >= parent_time(parent, cost, problem.costs):
        return None
    return out


def _options(problem: Problem, parent_size: int, kids: list[Child]) -> list[_Option]:
    """The node's children as they are, then the LPT packing of its samples at every child
    size that tiles the node's ranks (never one child as wide as the parent: that is the
    unrepacked layout, which the planner compares separately)."""
    cost = problem.cost
    ranks = sum(c.size for c in kids)
    start = min(c.start for c in kids)
    members = [s for c in kids for s in c.samples]
    out = [_option(problem, tuple(kids))]
    for k in problem.child_sizes:
        if k > ranks or k >= parent_size or ranks % k:
            continue
        packed = packed_children(problem, members, ranks // k, k)
        if packed is None:
            continue
        groups, tokens, sparse = packed
        z = max(
            child_layer_seconds(cost, k, sp, tok) for sp, tok in zip(sparse, tokens, strict=True)
        )
        m = max(ceil_div(tok, k) for tok in tokens)
        children = tuple(Child(start + i * k, k, tuple(group)) for i, group in enumerate(groups))
        out.append((children, z, m))
    return out


def _option(problem: Problem, kids: tuple[Child, ...]) -> _Option:
    cost = problem.cost
    z, m = 0.0, 0
    for c in kids:
        tokens = sum(problem.tokens[s] for s in c.samples)
        sparse = sum(problem.sparse_s[s] for s in c.samples)
        z = max(z, child_layer_seconds(cost, c.size, sparse, tokens))
        m = max(m, ceil_div(tokens, c.size))
    return kids, z, m
