"""Fused variable all-to-alls: child layout <-> head-sharded parent layout, in one collective.

``to_full`` takes this rank's child-layout Q, K, V (``[n_local, heads, head_dim]``) to the
parent's head-sharded layout (``[T_parent, heads/P, head_dim]``, tokens in parent packed order)
with ONE ``all_to_all_single`` over the parent group: the token move (child -> parent layout)
and the Ulysses head exchange are the same collective, because rank i sends its ``n_i`` tokens'
head slice j to rank j and the receive buffer, concatenated in rank order, *is* the parent's
packed sequence. ``to_child`` is its inverse. The same functions, on the child group with the
child's split sizes, are the sparse layers' Ulysses exchange, and on an unrepacked parent (or the
baseline) the ordinary Ulysses exchange: one code path.

Split sizes come from the plan on the host, so no count exchange and no device-to-host sync is
needed before the data moves (torchtitan-style variable collectives exchange counts first; the
plan already holds them, identically on every rank).

``to_full``/``to_child`` are differentiable reshapes around the autograd function
``VariableAllToAll``, whose backward is the transposed all-to-all (swapped split sizes).

GQA: rank j of a group of P needs the KV heads of its query heads. With ``kv_heads >= P`` it
gets ``kv_heads/P`` of them; with ``kv_heads < P`` (``P % kv_heads == 0``) each KV head is sent
to ``P/kv_heads`` ranks. The replication is an ``index_select`` before the exchange, so autograd
sums the replicas' gradients (``index_add``) on the way back.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from runtime_client.groups import RepackGroups
from runtime_client.local_layout import GroupSite, LocalLayout


class VariableAllToAll(torch.autograd.Function):
    """``all_to_all_single`` along dim 0 with uneven splits; backward is the transposed one."""

    @staticmethod
    def forward(
        ctx: Any,
        x_R: torch.Tensor,
        input_split_sizes: list[int],
        output_split_sizes: list[int],
        group: dist.ProcessGroup,
    ) -> torch.Tensor:
        ctx.splits = (input_split_sizes, output_split_sizes)
        ctx.group = group
        return _exchange(x_R, input_split_sizes, output_split_sizes, group)

    @staticmethod
    def backward(ctx: Any, grad_R: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input_split_sizes, output_split_sizes = ctx.splits
        # A collective in backward: every peer must reach it. Each peer issued the same
        # exchanges in the same (layer) order, so backward meets them in the same reverse order;
        # a rank whose loss did not depend on the output would skip it and hang its peers, which
        # is why empty shards stay connected to the graph (toy_model.varlen_attention).
        grad_x = _exchange(grad_R, output_split_sizes, input_split_sizes, ctx.group)
        return grad_x, None, None, None


def _exchange(
    x_R: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup
) -> torch.Tensor:
    if x_R.shape[0] != sum(send):
        raise ValueError(f"Expected {sum(send)} rows to send, got {x_R.shape[0]}.")
    out_R = x_R.new_empty((sum(recv), *x_R.shape[1:]))
    dist.all_to_all_single(out_R, x_R.contiguous(), recv, send, group=group)
    return out_R


def variable_all_to_all(
    x_R: torch.Tensor, site: GroupSite, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Rows of ``x_R`` grouped by destination -> rows grouped by source, per ``site``."""
    if group is None:  # single-rank group: the exchange is the identity
        return x_R
    return VariableAllToAll.apply(
        x_R, list(site.input_split_sizes), list(site.output_split_sizes), group
    )


def kv_heads_per_rank(kv_heads: int, group_size: int) -> int:
    """KV heads each group rank holds after the exchange (1 when replicated)."""
    if kv_heads >= group_size:
        if kv_heads % group_size:
            raise ValueError(f"kv_heads {kv_heads} not divisible by group size {group_size}")
        return kv_heads // group_size
    if group_size % kv_heads:
        raise ValueError(f"group size {group_size} not a multiple of kv_heads {kv_heads}")
    return 1


def sequence_to_heads(
    q_NHD: torch.Tensor,
    k_NKD: torch.Tensor,
    v_NKD: torch.Tensor,
    site: GroupSite,
    group: dist.ProcessGroup | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused Q/K/V exchange: ``[n, H, D]`` per rank -> ``[T_group, H/P, D]`` per rank."""
    n, heads, dim = q_NHD.shape
    p = site.size
    if heads % p:
        raise ValueError(f"heads {heads} not divisible by group size {p}")
    h_local, kv_local = heads // p, kv_heads_per_rank(k_NKD.shape[1], p)
    if kv_local * p != k_NKD.shape[1]:
        # Replicate: destination j gets KV head j*kv/P (the one its query heads use).
        src_K = torch.arange(p, device=k_NKD.device) * k_NKD.shape[1] // p
        k_NKD, v_NKD = k_NKD.index_select(1, src_K), v_NKD.index_select(1, src_K)
    # Per destination j: its head slice of q, k and v side by side, so one exchange moves all.
    qkv_NPCD = torch.cat(
        [
            q_NHD.reshape(n, p, h_local, dim),
            k_NKD.reshape(n, p, kv_local, dim),
            v_NKD.reshape(n, p, kv_local, dim),
        ],
        dim=2,
    )
    send_RCD = qkv_NPCD.transpose(0, 1).reshape(p * n, h_local + 2 * kv_local, dim)
    recv_TCD = variable_all_to_all(send_RCD, site, group)
    q_THD, k_TKD, v_TKD = recv_TCD.split([h_local, kv_local, kv_local], dim=1)
    return q_THD, k_TKD, v_TKD


def heads_to_sequence(
    o_THD: torch.Tensor, site: GroupSite, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Inverse of ``sequence_to_heads`` for the attention output: ``[T, H/P, D] -> [n, H, D]``.

    ``site`` is the heads-to-sequence exchange (the plan's ``to_child``): rank i receives its
    ``n_i`` tokens' head slice from every group rank.
    """
    p = site.size
    n = site.output_split_sizes[site.index]
    recv_RHD = variable_all_to_all(o_THD, site, group)  # rows: source rank, then token
    _, h_local, dim = o_THD.shape
    return recv_RHD.reshape(p, n, h_local, dim).transpose(0, 1).reshape(n, p * h_local, dim)


class RepackComm:
    """The four exchanges of one step for this rank, bound to its layout and communicators."""

    def __init__(self, layout: LocalLayout, groups: RepackGroups) -> None:
        self.layout = layout
        self.parent_group = groups.group(layout.parent_ranks)
        self.child_group = groups.group(layout.child_ranks)

    def to_full(
        self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Child layout -> parent's head-sharded layout (before full attention)."""
        return sequence_to_heads(q_NHD, k_NKD, v_NKD, self.layout.to_full, self.parent_group)

    def to_child(self, o_THD: torch.Tensor) -> torch.Tensor:
        """Parent's head-sharded layout -> child layout (after full attention)."""
        return heads_to_sequence(o_THD, self.layout.to_child, self.parent_group)

    def child_to_heads(
        self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sparse layers' Ulysses exchange over the child group."""
        site = self.layout.child_ulysses
        return sequence_to_heads(q_NHD, k_NKD, v_NKD, site, self.child_group)

    def child_to_sequence(self, o_THD: torch.Tensor) -> torch.Tensor:
        """Inverse of ``child_to_heads``."""
        return heads_to_sequence(o_THD, self.layout.child_ulysses.transposed(), self.child_group)
