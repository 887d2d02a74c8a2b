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

Copies: the packed send buffer is written ONCE, straight from Q/K/V (KV replication is a
broadcast inside that copy, not an ``index_select``), into a buffer reused across layers and
steps (``ExchangeBuffers``, one per row shape and dtype, grown when a step needs more rows).
The old path (``torch.cat`` of the head slices, then a transposing ``reshape``) copied twice,
three or four times with replication; it stays as ``fused_pack=False`` for comparison
(``bench/fused_all_to_all.py`` counts allocations of both).

Overlap: ``RepackComm.to_full_async`` starts the exchange (``async_op=True``) and returns a
``PendingExchange``; the layer runs independent work and calls ``wait()`` before it needs Q/K/V.
A buffer in flight is never handed out again until its exchange was waited on.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from runtime_client.exchange_buffers import ExchangeBuffers, PendingExchange
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


class FusedSequenceToHeads(torch.autograd.Function):
    """Q/K/V packed per destination straight into a send buffer, then one all-to-all.

    Forward writes each of Q, K, V once into ``[P, n, C, D]`` (C = local Q heads + 2 x local KV
    heads; KV replication as a broadcasting copy) and exchanges it; backward exchanges the
    gradient back and cuts it into dQ, dK, dV (summing the KV replicas).
    """

    @staticmethod
    def forward(
        ctx: Any,
        q_NHD: torch.Tensor,
        k_NKD: torch.Tensor,
        v_NKD: torch.Tensor,
        site: GroupSite,
        group: dist.ProcessGroup,
        buffers: ExchangeBuffers,
        pending: list[Any],
    ) -> torch.Tensor:
        n, heads, dim = q_NHD.shape
        p, kv = site.size, k_NKD.shape[1]
        h_local, kv_local = heads // p, kv_heads_per_rank(kv, p)
        chans = h_local + 2 * kv_local
        send, key = buffers.acquire(p * n, (chans, dim), q_NHD.dtype, q_NHD.device)
        send_PNCD = send.view(p, n, chans, dim)
        send_PNCD[:, :, :h_local].copy_(q_NHD.reshape(n, p, h_local, dim).transpose(0, 1))
        for at, x_NKD in ((h_local, k_NKD), (h_local + kv_local, v_NKD)):
            _pack_kv(send_PNCD[:, :, at : at + kv_local], x_NKD, p)
        recv_TCD = send.new_empty((sum(site.output_split_sizes), chans, dim))
        work = dist.all_to_all_single(
            recv_TCD,
            send,
            list(site.output_split_sizes),
            list(site.input_split_sizes),
            group=group,
            async_op=bool(pending),
        )
        if pending:  # the caller waits (PendingExchange); the buffer is released then
            pending[0].work, pending[0].release = work, lambda: buffers.release(key)
        else:
            buffers.release(key)
        ctx.meta = (site, group, n, heads, kv, dim)
        return recv_TCD

    @staticmethod
    def backward(ctx: Any, grad_TCD: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        site, group, n, heads, kv, dim = ctx.meta
        p = site.size
        h_local, kv_local = heads // p, kv_heads_per_rank(kv, p)
        grad_R = _exchange(
            grad_TCD, list(site.output_split_sizes), list(site.input_split_sizes), group
        )
        grad_PNCD = grad_R.view(p, n, h_local + 2 * kv_local, dim)
        grad_q = grad_PNCD[:, :, :h_local].transpose(0, 1).reshape(n, heads, dim)
        grad_k = _unpack_kv(grad_PNCD[:, :, h_local : h_local + kv_local], kv, n)
        grad_v = _unpack_kv(grad_PNCD[:, :, h_local + kv_local :], kv, n)
        return grad_q, grad_k, grad_v, None, None, None, None


def _pack_kv(dest_PNKD: torch.Tensor, x_NKD: torch.Tensor, p: int) -> None:
    """Destination j gets KV heads ``[j*kv/P, (j+1)*kv/P)`` or, when kv < P, head ``j*kv/P``."""
    n, kv, dim = x_NKD.shape
    if kv >= p:
        dest_PNKD.copy_(x_NKD.reshape(n, p, kv // p, dim).transpose(0, 1))
        return
    rep = p // kv  # destinations per KV head; the copy broadcasts over them (no index_select)
    dest_VRN1D = dest_PNKD.view(kv, rep, n, 1, dim)
    dest_VRN1D.copy_(x_NKD.transpose(0, 1).unsqueeze(1).unsqueeze(3))


def _unpack_kv(grad_PNKD: torch.Tensor, kv: int, n: int) -> torch.Tensor:
    """Gradient of ``_pack_kv``: the transposed copy, with the replicas summed."""
    p, _, _, dim = grad_PNKD.shape
    if kv >= p:
        return grad_PNKD.transpose(0, 1).reshape(n, kv, dim)
    return grad_PNKD.reshape(kv, p // kv, n, dim).sum(dim=1).transpose(0, 1).contiguous()


def fused_sequence_to_heads(
    q_NHD: torch.Tensor,
    k_NKD: torch.Tensor,
    v_NKD: torch.Tensor,
    site: GroupSite,
    group: dist.ProcessGroup | None,
    buffers: ExchangeBuffers,
    *,
    async_op: bool = False,
) -> PendingExchange:
    """``sequence_to_heads`` with one copy into a reused buffer; optionally asynchronous."""
    n, heads, _ = q_NHD.shape
    p = site.size
    if heads % p:
        raise ValueError(f"heads {heads} not divisible by group size {p}")
    kv_local = kv_heads_per_rank(k_NKD.shape[1], p)
    if n * p != sum(site.input_split_sizes):
        raise ValueError(f"Expected {sum(site.input_split_sizes) // p} tokens, got {n}.")
    if group is None and n > 0:  # single-rank group: no exchange, and no copy
        return PendingExchange((q_NHD, k_NKD, v_NKD))
    if group is None:
        # No tokens: the outputs must still depend on Q, K *and* V (empty attention only ties
        # its output to Q), or their weights get no gradient here but one on other ranks.
        return PendingExchange(sequence_to_heads(q_NHD, k_NKD, v_NKD, site, group))
    pending = PendingExchange(())
    recv_TCD = FusedSequenceToHeads.apply(
        q_NHD, k_NKD, v_NKD, site, group, buffers, [pending] if async_op else []
    )
    pending.outputs = tuple(recv_TCD.split([heads // p, kv_local, kv_local], dim=1))
    return pending


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


_PROCESS_BUFFERS = ExchangeBuffers()
"""Default send buffers of this process, shared by every ``RepackComm`` (one per step)."""


class RepackComm:
    """The four exchanges of one step for this rank, bound to its layout and communicators.

    ``fused_pack`` (default) writes the send buffer once into ``buffers`` (the process's
    shared ``ExchangeBuffers`` unless given); False keeps the older cat-and-reshape packing.
    """

    def __init__(
        self,
        layout: LocalLayout,
        groups: RepackGroups,
        *,
        buffers: ExchangeBuffers | None = None,
        fused_pack: bool = True,
    ) -> None:
        self.layout = layout
        self.parent_group = groups.group(layout.parent_ranks)
        self.child_group = groups.group(layout.child_ranks)
        self.buffers = _PROCESS_BUFFERS if buffers is None else buffers
        self.fused_pack = fused_pack

    def _to_heads(
        self,
        q_NHD: torch.Tensor,
        k_NKD: torch.Tensor,
        v_NKD: torch.Tensor,
        site: GroupSite,
        group: dist.ProcessGroup | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self.fused_pack:
            return sequence_to_heads(q_NHD, k_NKD, v_NKD, site, group)
        q, k, v = fused_sequence_to_heads(q_NHD, k_NKD, v_NKD, site, group, self.buffers).wait()
        return q, k, v

    def to_full(
        self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Child layout -> parent's head-sharded layout (before full attention)."""
        return self._to_heads(q_NHD, k_NKD, v_NKD, self.layout.to_full, self.parent_group)

    def to_full_async(
        self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor
    ) -> PendingExchange:
        """``to_full`` started with ``async_op=True``: overlap independent work, then
        ``wait()`` for ``(q_THD, k_TKD, v_TKD)``. Backward runs synchronously."""
        site, group = self.layout.to_full, self.parent_group
        return fused_sequence_to_heads(
            q_NHD, k_NKD, v_NKD, site, group, self.buffers, async_op=True
        )

    def to_child(self, o_THD: torch.Tensor) -> torch.Tensor:
        """Parent's head-sharded layout -> child layout (after full attention)."""
        return heads_to_sequence(o_THD, self.layout.to_child, self.parent_group)

    def child_to_heads(
        self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sparse layers' Ulysses exchange over the child group."""
        return self._to_heads(q_NHD, k_NKD, v_NKD, self.layout.child_ulysses, self.child_group)

    def child_to_sequence(self, o_THD: torch.Tensor) -> torch.Tensor:
        """Inverse of ``child_to_heads``."""
        return heads_to_sequence(o_THD, self.layout.child_ulysses.transposed(), self.child_group)
