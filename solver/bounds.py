"""True lower bounds on the step time, so that the reported gap means something.

Every bound here is a relaxation of the cost model, never an estimate:

* ``aggregate``: every parent's rank-seconds are at least its compute with no communication, and
  the step is at least the mean over ranks (all modes, any membership, any sizes);
* ``per sample``: a parent holding sample i is at least as slow as i alone in its best layout;
* ``per parent`` (fixed membership): the larger of its members' single-sample bounds and its own
  work spread evenly, or its unrepacked time if that is smaller (both layouts are allowed).
"""

from __future__ import annotations

from collections.abc import Sequence

from solver.cost_model import ceil_div, full_layer_seconds, unrepacked_parent_seconds
from solver.membership import single_sample_bound
from solver.problem import Problem


def aggregate_bound(problem: Problem) -> float:
    cost = problem.cost
    lin = cost.linear_seconds_per_token
    total_tokens = sum(problem.tokens)
    rank_seconds = cost.full_layers * (
        sum(problem.full_s) + total_tokens * lin
    ) + cost.sparse_layers * sum(problem.work_s)
    return rank_seconds / cost.world_size


def unrepacked_seconds(problem: Problem, size: int, members: Sequence[int]) -> float:
    return unrepacked_parent_seconds(
        problem.cost,
        size,
        sum(problem.full_s[s] for s in members),
        sum(problem.sparse_s[s] for s in members),
        sum(problem.tokens[s] for s in members),
    )


def repacked_bound(problem: Problem, size: int, members: Sequence[int]) -> float:
    """Lower bound of any repacked layout of ``members`` in a parent of ``size``."""
    cost = problem.cost
    if not members:
        return 0.0
    single = max(single_sample_bound(problem, s, size) for s in members)
    work = sum(problem.work_s[s] for s in members) / size
    # Children stay inside a node, so the longest member puts at least L / min(P, G) tokens on
    # some rank; and some rank holds at least the average.
    widest_child = min(size, cost.gpus_per_node)
    m = max(
        ceil_div(sum(problem.tokens[s] for s in members), size),
        ceil_div(max(problem.tokens[s] for s in members), widest_child),
    )
    full = full_layer_seconds(cost, size, sum(problem.full_s[s] for s in members), m)
    return cost.full_layers * full + cost.sparse_layers * max(single, work)


def parent_bound(problem: Problem, size: int, members: Sequence[int], repack: bool) -> float:
    base = unrepacked_seconds(problem, size, members)
    return min(base, repacked_bound(problem, size, members)) if repack else base


def membership_free_bound(problem: Problem, sizes: Sequence[int], repack: bool) -> float:
    """Bound over every membership of the given parent sizes."""
    # Every per-sample term grows with the sample's length, so the longest sample's bound is
    # the largest one.
    longest = max(range(problem.num_samples), key=lambda s: (problem.tokens[s], -s))
    per_sample = min(
        parent_bound(problem, size, [longest], repack)
        for size in sorted(set(sizes))
        if problem.tokens[longest] <= problem.capacity(size)
    )
    return max(per_sample, aggregate_bound(problem))
