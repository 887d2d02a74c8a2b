"""A tiny 1F3S hybrid-attention model with a small MoE, for correctness tests and the example.

Full attention (causal, per sample) every ``len(pattern)``-th layer, sliding-window attention
otherwise; RMSNorm, rotary embeddings on in-sample positions, GQA, top-k MoE with dense expert
compute (every token runs every expert, weighted by its sparse gate: slow, but exact and free
of data-dependent shapes, which is what a reference wants).

Where attention runs is an ``AttentionBackend``: ``LocalAttention`` for one process over packed
samples (the reference), ``RepackAttention`` for the repacked layout (``to_full`` -> full
attention over the parent with ``heads/P`` heads -> ``to_child``; Ulysses over the child group
for sparse layers). Everything else is token-local, so the model code is the same for both.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from runtime_client.all_to_all import RepackComm
from runtime_client.attention import Impl, repacked_full_attention, repacked_sparse_attention
from runtime_client.packed_seq import PackedSeqParams


@dataclass(kw_only=True, frozen=True)
class ToyConfig:
    """Shape of the toy model (defaults: small enough for 16 CPU ranks in a test)."""

    vocab: int = 64
    """Vocabulary size."""

    hidden: int = 32
    """Residual width."""

    heads: int = 16
    """Query heads; must be divisible by every parent and child size used."""

    kv_heads: int = 4
    """KV heads (GQA); replicated when a group is wider."""

    head_dim: int = 8
    """Per-head width."""

    layers: int = 4
    """Number of layers; ``pattern`` repeats over them."""

    pattern: str = "FSSS"
    """Layer kinds: F = full causal attention, S = sliding-window attention."""

    window: int = 16
    """Sliding window of sparse layers (tokens, including the token itself)."""

    experts: int = 4
    """MoE experts per layer."""

    top_k: int = 2
    """Experts each token uses."""

    ffn: int = 32
    """Expert hidden width."""

    rope_base: float = 10_000.0
    """Rotary embedding base."""

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"Expected kv_heads dividing heads, got {self.kv_heads}.")
        if set(self.pattern) - {"F", "S"}:
            raise ValueError(f"Expected a pattern of F and S, got {self.pattern!r}.")


def varlen_attention(
    q_THD: torch.Tensor,
    k_TKD: torch.Tensor,
    v_TKD: torch.Tensor,
    cu_seqlens: Sequence[int],
    window: int | None,
) -> torch.Tensor:
    """Causal attention inside each sample of a packed sequence; optional sliding window.

    Full attention loops over samples (each sample's ``L x L`` scores: the sum of squares the
    cost model prices, never a ``T x T`` matrix). Sliding-window attention has no loop at all
    (``windowed_attention``): its work is ``T x window``, as the cost model prices it."""
    if window is not None:
        return windowed_attention(q_THD, k_TKD, v_TKD, cu_seqlens, window)
    return per_sample_attention(q_THD, k_TKD, v_TKD, cu_seqlens, None)


def per_sample_attention(
    q_THD: torch.Tensor,
    k_TKD: torch.Tensor,
    v_TKD: torch.Tensor,
    cu_seqlens: Sequence[int],
    window: int | None,
) -> torch.Tensor:
    """The reference: one masked ``L x L`` attention per sample (a Python loop)."""
    _, heads, dim = q_THD.shape
    rep = heads // k_TKD.shape[1]  # local query heads per local KV head
    outs = []
    for a, b in itertools.pairwise(cu_seqlens):
        q_HLD = q_THD[a:b].transpose(0, 1)
        k_HLD = k_TKD[a:b].repeat_interleave(rep, dim=1).transpose(0, 1)
        v_HLD = v_TKD[a:b].repeat_interleave(rep, dim=1).transpose(0, 1)
        scores_HLL = q_HLD @ k_HLD.transpose(1, 2) / math.sqrt(dim)
        i = torch.arange(b - a, device=q_THD.device).unsqueeze(1)
        j = torch.arange(b - a, device=q_THD.device).unsqueeze(0)
        allowed_LL = j <= i
        if window is not None:
            allowed_LL &= i - j < window
        probs_HLL = scores_HLL.masked_fill(~allowed_LL, float("-inf")).softmax(dim=-1)
        outs.append((probs_HLL @ v_HLD).transpose(0, 1))
    if not outs:  # no samples here: keep the graph connected so backward collectives still run
        return q_THD * 0.0
    return torch.cat(outs, dim=0)


def windowed_attention(
    q_THD: torch.Tensor,
    k_TKD: torch.Tensor,
    v_TKD: torch.Tensor,
    cu_seqlens: Sequence[int],
    window: int,
) -> torch.Tensor:
    """Sliding-window causal attention over a packed sequence without a per-sample loop:
    each token gathers the ``window`` keys ending at itself and masks those before its
    sample's start, so the work is ``T x window`` (``T x T`` never exists)."""
    total, heads, dim = q_THD.shape
    if total == 0:
        return q_THD * 0.0
    rep = heads // k_TKD.shape[1]
    device = q_THD.device
    cu = torch.as_tensor(list(cu_seqlens), device=device)
    lengths = cu[1:] - cu[:-1]
    start_T = torch.repeat_interleave(cu[:-1], lengths)  # first token of each token's sample
    w = min(window, total)
    idx_TW = (
        torch.arange(total, device=device).unsqueeze(1) - (w - 1) + torch.arange(w, device=device)
    )
    allowed_TW = idx_TW >= start_T.unsqueeze(1)
    idx_TW = idx_TW.clamp(min=0)
    k_TWKD, v_TWKD = k_TKD[idx_TW], v_TKD[idx_TW]
    q_TKRD = q_THD.view(total, -1, rep, dim)  # query heads grouped by their KV head
    scores_TKRW = torch.einsum("tkrd,twkd->tkrw", q_TKRD, k_TWKD) / math.sqrt(dim)
    mask = ~allowed_TW.view(total, 1, 1, w)
    probs_TKRW = scores_TKRW.masked_fill(mask, float("-inf")).softmax(dim=-1)
    o_TKRD = torch.einsum("tkrw,twkd->tkrd", probs_TKRW, v_TWKD)
    return o_TKRD.reshape(total, heads, dim)


class AttentionBackend(Protocol):
    """Where and over which tokens attention runs; inputs and outputs in the local layout."""

    def full(self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor) -> torch.Tensor:
        """Causal attention over whole samples."""
        ...

    def sparse(
        self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor, window: int
    ) -> torch.Tensor:
        """Sliding-window causal attention over whole samples."""
        ...


class LocalAttention:
    """One process holding whole samples, packed with ``cu_seqlens``."""

    def __init__(self, cu_seqlens: Sequence[int]) -> None:
        self.cu_seqlens = list(cu_seqlens)

    def full(self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor) -> torch.Tensor:
        return varlen_attention(q_NHD, k_NKD, v_NKD, self.cu_seqlens, None)

    def sparse(
        self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor, window: int
    ) -> torch.Tensor:
        return varlen_attention(q_NHD, k_NKD, v_NKD, self.cu_seqlens, window)


class RepackAttention:
    """The repacked layout: parent group for full layers, child group for sparse layers."""

    def __init__(self, comm: RepackComm) -> None:
        self.comm = comm

    def full(self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor) -> torch.Tensor:
        q_THD, k_TKD, v_TKD = self.comm.to_full(q_NHD, k_NKD, v_NKD)
        o_THD = varlen_attention(q_THD, k_TKD, v_TKD, self.comm.layout.cu_seqlens_full, None)
        return self.comm.to_child(o_THD)

    def sparse(
        self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor, window: int
    ) -> torch.Tensor:
        q_THD, k_TKD, v_TKD = self.comm.child_to_heads(q_NHD, k_NKD, v_NKD)
        cu = self.comm.layout.cu_seqlens_sparse
        o_THD = varlen_attention(q_THD, k_TKD, v_TKD, cu, window)
        return self.comm.child_to_sequence(o_THD)


class VarlenRepackAttention:
    """The repacked layout through the varlen kernels (``runtime_client.attention``), driven by
    the data iterator's device ``PackedSeqParams`` (``RepackBatch.full`` / ``.sparse``)."""

    def __init__(
        self,
        comm: RepackComm,
        full: PackedSeqParams,
        sparse: PackedSeqParams,
        impl: Impl = "auto",
    ) -> None:
        self.comm, self.full_params, self.sparse_params, self.impl = comm, full, sparse, impl

    def full(self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor) -> torch.Tensor:
        return repacked_full_attention(
            q_NHD, k_NKD, v_NKD, self.comm, self.full_params, impl=self.impl
        )

    def sparse(
        self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor, window: int
    ) -> torch.Tensor:
        return repacked_sparse_attention(
            q_NHD, k_NKD, v_NKD, self.comm, self.sparse_params, window, impl=self.impl
        )


def apply_rope(x_NHD: torch.Tensor, pos_N: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form) at in-sample positions ``pos_N``."""
    half = x_NHD.shape[-1] // 2
    freq = base ** (-torch.arange(half, dtype=x_NHD.dtype, device=x_NHD.device) / half)
    angle_NF = pos_N.to(x_NHD.dtype).unsqueeze(1) * freq.unsqueeze(0)
    cos, sin = angle_NF.cos().unsqueeze(1), angle_NF.sin().unsqueeze(1)
    x1, x2 = x_NHD[..., :half], x_NHD[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ToyConfig, kind: str) -> None:
        super().__init__()
        self.cfg, self.kind = cfg, kind
        self.wq = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(
        self, x_ND: torch.Tensor, pos_N: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        cfg, n = self.cfg, x_ND.shape[0]
        q_NHD = apply_rope(self.wq(x_ND).view(n, cfg.heads, cfg.head_dim), pos_N, cfg.rope_base)
        k_NKD = apply_rope(self.wk(x_ND).view(n, cfg.kv_heads, cfg.head_dim), pos_N, cfg.rope_base)
        v_NKD = self.wv(x_ND).view(n, cfg.kv_heads, cfg.head_dim)
        if self.kind == "F":
            o_NHD = backend.full(q_NHD, k_NKD, v_NKD)
        else:
            o_NHD = backend.sparse(q_NHD, k_NKD, v_NKD, cfg.window)
        return self.wo(o_NHD.reshape(n, cfg.heads * cfg.head_dim))


class MoE(nn.Module):
    """Top-k gated experts; dense compute, sparse gates (see the module docstring)."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        self.top_k = cfg.top_k
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.w_in_EDF = nn.Parameter(torch.randn(cfg.experts, cfg.hidden, cfg.ffn) * 0.1)
        self.w_out_EFD = nn.Parameter(torch.randn(cfg.experts, cfg.ffn, cfg.hidden) * 0.1)

    def forward(self, x_ND: torch.Tensor) -> torch.Tensor:
        probs_NE = self.router(x_ND).softmax(dim=-1)
        top_val_NK, top_idx_NK = probs_NE.topk(self.top_k, dim=-1)
        gates_NE = torch.zeros_like(probs_NE).scatter(
            1, top_idx_NK, top_val_NK / top_val_NK.sum(dim=-1, keepdim=True)
        )
        h_ENF = F.silu(torch.einsum("nd,edf->enf", x_ND, self.w_in_EDF))
        y_END = torch.einsum("enf,efd->end", h_ENF, self.w_out_EFD)
        return torch.einsum("ne,end->nd", gates_NE, y_END)


class Block(nn.Module):
    def __init__(self, cfg: ToyConfig, kind: str) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden)
        self.attn = Attention(cfg, kind)
        self.moe_norm = nn.RMSNorm(cfg.hidden)
        self.moe = MoE(cfg)

    def forward(
        self, x_ND: torch.Tensor, pos_N: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        x_ND = x_ND + self.attn(self.attn_norm(x_ND), pos_N, backend)
        return x_ND + self.moe(self.moe_norm(x_ND))


class ToyModel(nn.Module):
    """Embedding, ``layers`` hybrid blocks, final norm, LM head."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        kinds = [cfg.pattern[i % len(cfg.pattern)] for i in range(cfg.layers)]
        self.blocks = nn.ModuleList(Block(cfg, kind) for kind in kinds)
        self.norm = nn.RMSNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(
        self, tokens_N: torch.Tensor, pos_N: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        """Logits ``[n, vocab]`` for the tokens this process holds, in its layout."""
        x_ND = self.embed(tokens_N)
        for block in self.blocks:
            x_ND = block(x_ND, pos_N, backend)
        return self.head(self.norm(x_ND))


def reference_forward(
    model: ToyModel, tokens_T: torch.Tensor, global_cu_seqlens: Sequence[int]
) -> torch.Tensor:
    """Single-process reference: every sample run on its own, logits in global packed order."""
    outs = []
    for a, b in itertools.pairwise(global_cu_seqlens):
        pos = torch.arange(b - a, device=tokens_T.device)
        outs.append(model(tokens_T[a:b], pos, LocalAttention([0, b - a])))
    return torch.cat(outs, dim=0)


def synthetic_batch(
    lengths: Sequence[int], vocab: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and labels of a global packed batch (samples in id order), same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    total = int(sum(lengths))
    tokens_T = torch.randint(0, vocab, (total,), generator=gen)
    labels_T = torch.randint(0, vocab, (total,), generator=gen)
    return tokens_T, labels_T
