"""Fused variable all-to-all on 16 forked gloo ranks against a single-process reference.

Forward: ``to_full`` must deliver exactly the parent's packed tokens with this rank's head slice
(and the right, replicated KV heads); ``to_child`` must invert it. Backward: the gradients that
reach each rank's local Q/K/V must equal autograd through the reference gather, including the
sum over KV replicas. The same for the child-level Ulysses exchange. Each case runs with every
packing mode (``MODES``), the reused buffers shared across cases as in training."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
from rt_plans import ChildSpec, hand_plan

from runtime_client.all_to_all import RepackComm, kv_heads_per_rank
from runtime_client.exchange_buffers import ExchangeBuffers
from runtime_client.groups import GroupConfig, RepackGroups
from runtime_client.local_launch import run_local_ranks
from runtime_client.local_layout import GroupSite, LocalLayout, plan_lengths
from solver.schema import Plan

HEADS, DIM = 16, 4
LENGTHS = [30, 5, 9, 40, 3, 20, 11, 17, 2, 60, 8]
MIXED: list[
    list[ChildSpec]
] = [  # parents 8, 4, 2, 1, 1: children 4, 2, empty 1, 1 / unrepacked 4 / 2 / 1 / 1
    [(4, [0]), (2, [1, 2]), (1, []), (1, [3, 8])],
    [(4, [4, 5])],
    [(2, [6, 10])],
    [(1, [7])],
    [(1, [9])],
]
WIDE: list[
    list[ChildSpec]
] = [  # one parent of 16 over two nodes: children 8 / 4, 2, 1 and an empty 1
    [(8, [9, 0]), (4, [3, 1]), (2, [4, 5, 6]), (1, [2, 7, 8, 10]), (1, [])],
]
CASES = [("mixed", MIXED, 4), ("wide", WIDE, 4), ("wide", WIDE, 8), ("wide", WIDE, 16)]
MODES = ("fused", "cat", "async")
"""Send-buffer packing: one copy into a reused buffer (default), the older cat-and-reshape, and
the fused one started with ``async_op=True`` and waited on."""


def _kv_heads_of(index: int, size: int, kv: int) -> list[int]:
    """KV heads group rank ``index`` needs: its query heads' KV heads."""
    per = kv_heads_per_rank(kv, size)
    first = index * kv // size
    return list(range(first, first + per))


def _check_site(
    rank: int,
    layouts: list[LocalLayout],
    site_of: Callable[[LocalLayout], GroupSite],
    fwd: Callable[..., tuple[torch.Tensor, ...]],
    back: Callable[[torch.Tensor], torch.Tensor],
    kv: int,
) -> None:
    total = layouts[0].total_tokens
    gen = torch.Generator().manual_seed(0)
    q_G, k_G, v_G = (torch.randn(total, h, DIM, generator=gen) for h in (HEADS, kv, kv))
    lay = layouts[rank]
    idx = lay.global_index_N
    local = [x[idx].clone().requires_grad_() for x in (q_G, k_G, v_G)]
    outs = fwd(*local)
    # Reference: gather the group's expected outputs from the global tensors, one process.
    ref_in = [x.clone().requires_grad_() for x in (q_G, k_G, v_G)]
    ref_loss, local_loss = torch.zeros(()), torch.zeros(())
    lo, hi = site_of(lay).ranks  # only this rank's group sends it gradient
    for r in range(lo, hi):
        site = site_of(layouts[r])
        members = layouts[site.ranks[0] : site.ranks[1]]
        packed = torch.cat([m.global_index_N for m in members])
        h = HEADS // site.size
        heads = [list(range(site.index * h, (site.index + 1) * h))]
        heads += [_kv_heads_of(site.index, site.size, kv)] * 2
        weights = torch.Generator().manual_seed(1000 + r)
        for x_ref, cols, j in zip(ref_in, heads, range(3), strict=True):
            expect = x_ref[packed][:, cols]
            w = torch.randn(expect.shape, generator=weights)
            ref_loss = ref_loss + (w * expect).sum()
            if r == rank:
                assert torch.equal(outs[j].detach(), expect.detach()), (r, j)
                local_loss = local_loss + (w * outs[j]).sum()
    local_loss.backward()  # one collective backward through the fused exchange
    ref_loss.backward()
    for x, x_ref in zip(local, ref_in, strict=True):
        assert x.grad is not None and x_ref.grad is not None
        torch.testing.assert_close(x.grad, x_ref.grad[idx], rtol=1e-6, atol=1e-6)
    assert torch.equal(back(outs[0].detach()), local[0].detach())  # the inverse exchange


def _waited(comm: RepackComm) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``to_full`` through the async path: start, then wait (nothing to overlap here)."""

    def to_full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return comm.to_full_async(q, k, v).wait()

    return to_full


def _worker(rank: int, world: int, plans: list[tuple[Plan, int]]) -> int:
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=8, timeout_s=60)).setup()
    buffers = ExchangeBuffers()
    checked = 0
    for (p, kv), mode in itertools.product(plans, MODES):
        layouts = [LocalLayout.from_plan(p, r) for r in range(world)]
        comm = RepackComm(layouts[rank], groups, buffers=buffers, fused_pack=mode != "cat")
        to_full = _waited(comm) if mode == "async" else comm.to_full
        _check_site(rank, layouts, lambda lay: lay.to_full, to_full, comm.to_child, kv)
        _check_site(
            rank,
            layouts,
            lambda lay: lay.child_ulysses,
            comm.child_to_heads,
            comm.child_to_sequence,
            kv,
        )
        checked += 1
    return checked


@pytest.mark.slow
def test_fused_all_to_all_matches_reference_on_16_ranks() -> None:
    plans = [(hand_plan(LENGTHS, layout, kv_heads=kv), kv) for _, layout, kv in CASES]
    assert sum(plan_lengths(plans[0][0])) == sum(LENGTHS)
    assert run_local_ranks(_worker, 16, plans, timeout_s=240) == [len(CASES) * len(MODES)] * 16
