"""Moving each rank's own samples to the ranks a plan puts them on: lengths in, tokens out.

Conventions (the data iterator's, shared with ``LocalLayout``):

* every rank of the repack domain pulls its own samples; the *global packed batch* is rank 0's
  tokens, then rank 1's, ... (so sample ids run in that order too), and a sample's upstream
  parent is the parent whose ranks include the rank that pulled it;
* the plan's layout says which positions of that global batch each rank owns
  (``LocalLayout.global_index_N``); ``rank_token_positions`` computes them for *every* rank at
  once from the plan alone, so each rank knows what to send to whom without asking;
* one ``all_to_all_single`` of token rows (ids, and labels stacked beside them) moves the data;
  receivers put the rows back in layout order with a precomputed permutation.

Everything here runs on host tensors over a CPU-capable (gloo) group: token ids are small
(8 bytes per token and field) and come from the host-side data loader anyway.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from runtime_client.local_layout import plan_lengths, split_tokens
from solver.schema import Plan

END_OF_DATA = -1
"""Sample count a rank announces when its iterator is exhausted: every rank stops together."""


def gather_lengths(
    lengths: list[int] | None, group: dist.ProcessGroup | None
) -> list[list[int]] | None:
    """Every rank's sample lengths, in rank order; None when any rank has run out of data.

    Two all-gathers over ``group``: the counts, then the lengths padded to the longest count
    (counts before data, so nobody guesses a buffer size). A rank without data contributes
    ``END_OF_DATA`` and every rank returns None, instead of the others hanging.
    """
    world = dist.get_world_size(group)
    count = END_OF_DATA if lengths is None else len(lengths)
    counts_W = torch.empty(world, dtype=torch.int64)
    dist.all_gather_single(counts_W, torch.tensor([count], dtype=torch.int64), group=group)
    counts = counts_W.tolist()
    if END_OF_DATA in counts:
        return None
    width = max(counts)
    mine_L = torch.zeros(width, dtype=torch.int64)
    mine_L[:count] = torch.tensor(lengths or [], dtype=torch.int64)
    all_WL = torch.empty(world * width, dtype=torch.int64)
    if width:
        dist.all_gather_single(all_WL, mine_L, group=group)
    rows = all_WL.view(world, width).tolist()
    return [row[:n] for row, n in zip(rows, counts, strict=True)]


def upstream_parent_of(per_rank: list[list[int]], parent_sizes: list[int]) -> list[int]:
    """Upstream parent index of every sample (global id order): the parent of the rank that
    pulled it."""
    parent_of_rank = [j for j, size in enumerate(parent_sizes) for _ in range(size)]
    if len(parent_of_rank) != len(per_rank):
        raise ValueError(
            f"parent sizes {parent_sizes} cover {len(parent_of_rank)} ranks, "
            f"the domain has {len(per_rank)}"
        )
    return [parent_of_rank[r] for r, lengths in enumerate(per_rank) for _ in lengths]


def rank_token_positions(plan: Plan) -> list[torch.Tensor]:
    """Positions in the global packed batch of every rank's tokens, in the rank's layout order.

    A child's packed sequence is its samples in packing order; rank i of a child of size k owns
    ``split_tokens`` slice i of it (the rule ``LocalLayout`` uses). One pass over the plan.
    """
    lengths = plan_lengths(plan)
    starts = [0, *itertools.accumulate(lengths)]
    out: list[torch.Tensor] = [torch.zeros(0, dtype=torch.int64)] * len(plan.tokens)
    for child in plan.children:
        runs = [torch.arange(starts[s], starts[s] + lengths[s]) for s in child.samples]
        packed = torch.cat(runs) if runs else torch.zeros(0, dtype=torch.int64)
        size = child.ranks[1] - child.ranks[0]
        for i, part in enumerate(packed.split(split_tokens(packed.numel(), size))):
            out[child.ranks[0] + i] = part
    return out


@dataclass(frozen=True)
class ReroutePlan:
    """One rank's side of the token all-to-all."""

    send_index: torch.Tensor
    """Rows of this rank's local tokens to send, grouped by destination rank (int64)."""

    send_splits: list[int]
    """Rows to each destination, in rank order."""

    recv_splits: list[int]
    """Rows from each source, in rank order."""

    recv_order: torch.Tensor
    """``out[recv_order] = received``: puts rows (grouped by source) in layout order."""


def reroute_plan(plan: Plan, rank: int, tokens_per_rank: list[int]) -> ReroutePlan:
    """Who sends what to whom, computed identically on every rank from the plan.

    ``tokens_per_rank``: tokens each rank pulled (the global batch is their concatenation).
    """
    offsets_W = torch.tensor([0, *itertools.accumulate(tokens_per_rank)], dtype=torch.int64)
    positions = rank_token_positions(plan)
    if int(offsets_W[-1]) != sum(n.numel() for n in positions):
        raise ValueError(
            f"the plan places {sum(n.numel() for n in positions)} tokens, "
            f"the ranks pulled {int(offsets_W[-1])}"
        )
    lo, hi = int(offsets_W[rank]), int(offsets_W[rank + 1])
    send, send_splits = [], []
    for pos_N in positions:  # destinations in rank order
        mine = pos_N[(pos_N >= lo) & (pos_N < hi)]
        send.append(mine - lo)
        send_splits.append(mine.numel())
    # Rows arrive grouped by source rank, each group in this rank's layout order.
    source_N = torch.searchsorted(offsets_W, positions[rank], right=True) - 1
    recv_order = torch.sort(source_N, stable=True).indices
    recv_splits = torch.bincount(source_N, minlength=len(tokens_per_rank)).tolist()
    return ReroutePlan(torch.cat(send), send_splits, recv_splits, recv_order)


def reroute_rows(
    rows_TC: torch.Tensor, route: ReroutePlan, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """This rank's rows in its planned layout, via one ``all_to_all_single`` over ``group``."""
    send_RC = rows_TC.index_select(0, route.send_index)
    recv_RC = send_RC.new_empty((sum(route.recv_splits), *rows_TC.shape[1:]))
    dist.all_to_all_single(recv_RC, send_RC, route.recv_splits, route.send_splits, group=group)
    out_NC = torch.empty_like(recv_RC)
    out_NC[route.recv_order] = recv_RC
    return out_NC
