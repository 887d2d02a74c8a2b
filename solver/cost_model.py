"""Cost model of one training step (docs/design.md section 5), all terms in one place.

Times are seconds. Per-sample quantities are precomputed once per request (``SampleCosts``) so
the planners can evaluate a layout with sums; a child of size ``k`` holding samples ``S`` takes

    sparse_attention(S) / k + ceil(tokens(S) / k) * (linear_per_token + a2a_per_token(k))

per sparse layer, and a parent of size ``P`` takes, per full layer,

    full_attention(S) / P + max_rank_tokens * (linear_per_token + a2a_per_token(P)).

Every group of more than one rank also pays ``COLLECTIVES_PER_LAYER`` times the profile's fixed
latency per collective, every layer the profile's fixed compute overhead, and every sample a fixed
time per layer kind spread over its group (all 0 in the default profile, which reproduces the
design's numbers). Full attention, sliding-window attention and the linear/MoE part each run at
their own share of peak.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from solver.errors import PlanningError
from solver.profiles import Profile
from solver.schema import ClusterSpec, ModelSpec, PlanRequest

BYTES_PER_GB = 1e9
FLOPS_PER_TFLOP = 1e12
FWD_BWD_FLOPS_PER_MAC = 6  # 2 FLOPs per multiply-add, x3 for forward + backward
ALL_TO_ALL_PASSES = 2  # forward and backward
COLLECTIVES_PER_LAYER = 2 * ALL_TO_ALL_PASSES
"""All-to-all calls of one layer in a group of > 1 ranks: QKV out and O back, forward and
backward (the layout change rides on the same calls)."""
SECONDS_PER_US = 1e-6


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Coefficients of the cost model for one cluster and model."""

    gpus_per_node: int
    world_size: int
    full_layers: int
    sparse_layers: int
    full_flops_per_s: float
    """Achieved FLOP/s of one rank in full attention: peak x that part's efficiency."""
    sparse_flops_per_s: float
    """Achieved FLOP/s in sliding-window attention."""
    linear_flops_per_s: float
    """Achieved FLOP/s in projections and active experts."""
    peak_flops_per_s: float
    heads: int
    kv_heads: int
    head_dim: int
    window: int
    dtype_bytes: int
    linear_flops_per_token: float
    """Projections plus active experts, per layer, per token, forward + backward."""
    intra_bytes_per_s: float
    inter_bytes_per_s: float
    collective_latency_s: float
    """Fixed time of one all-to-all call."""
    collective_peer_latency_s: float = 0.0
    """Fixed time of one all-to-all call per peer beyond the first."""
    layer_overhead_s: float = 0.0
    """Fixed compute time of one layer on a rank (launch / dispatch overhead)."""
    sample_full_s: float = 0.0
    """Fixed time per sample of a full layer, on one rank (divided by the group like FLOPs)."""
    sample_sparse_s: float = 0.0
    """Fixed time per sample of a sparse layer, on one rank."""
    max_tokens_per_rank: int

    @classmethod
    def from_request(cls, request: PlanRequest) -> CostModel:
        """The cost model a request is planned with (its inline profile, else its cluster's).

        A ``profile_name`` alone cannot be planned here: stored profiles live in the service,
        which fills ``profile`` first (``solver.profile_lookup.with_named_profile``)."""
        if request.profile is None and request.profile_name is not None:
            raise PlanningError(
                "profile_name",
                f"names the stored profile {request.profile_name!r}, which only the service "
                "resolves; give the profile inline (`profile`, or --profile FILE)",
            )
        return cls.from_specs(request.cluster, request.model, request.cost_profile)

    @classmethod
    def from_specs(
        cls, cluster: ClusterSpec, model: ModelSpec, profile: Profile | None = None
    ) -> CostModel:
        """``profile`` replaces the cluster's peak, efficiency and bandwidths; without one the
        cluster's apply, with one efficiency for every part and no per-collective latency."""
        eff = cluster.compute_efficiency
        peak = cluster.peak_tflops * FLOPS_PER_TFLOP
        full_eff = sparse_eff = linear_eff = eff
        intra, inter, latency_us = cluster.intra_node_gbps, cluster.inter_node_gbps, 0.0
        peer_latency_us = 0.0
        layer_us = sample_full_us = sample_sparse_us = 0.0
        if profile is not None:
            peak = profile.peak_tflops * FLOPS_PER_TFLOP
            full_eff = profile.efficiency_full_attention
            sparse_eff = profile.efficiency_sparse_attention
            linear_eff = profile.efficiency_linear
            intra, inter = profile.intra_node_gbps, profile.inter_node_gbps
            latency_us = profile.collective_latency_us
            peer_latency_us = profile.collective_latency_us_per_peer
            layer_us = profile.layer_overhead_us
            sample_full_us = profile.sample_overhead_us_full
            sample_sparse_us = profile.sample_overhead_us_sparse
        attn_proj_params = (
            model.hidden * (model.heads + 2 * model.kv_heads) * model.head_dim
            + model.heads * model.head_dim * model.hidden
        )
        return cls(
            gpus_per_node=cluster.gpus_per_node,
            world_size=cluster.world_size,
            full_layers=model.full_layers,
            sparse_layers=model.sparse_layers,
            full_flops_per_s=peak * full_eff,
            sparse_flops_per_s=peak * sparse_eff,
            linear_flops_per_s=peak * linear_eff,
            peak_flops_per_s=peak,
            heads=model.heads,
            kv_heads=model.kv_heads,
            head_dim=model.head_dim,
            window=model.sparse_window,
            dtype_bytes=model.dtype_bytes,
            linear_flops_per_token=FWD_BWD_FLOPS_PER_MAC
            * (attn_proj_params + model.moe_active_params),
            intra_bytes_per_s=intra * BYTES_PER_GB,
            inter_bytes_per_s=inter * BYTES_PER_GB,
            collective_latency_s=latency_us * SECONDS_PER_US,
            collective_peer_latency_s=peer_latency_us * SECONDS_PER_US,
            layer_overhead_s=layer_us * SECONDS_PER_US,
            sample_full_s=sample_full_us * SECONDS_PER_US,
            sample_sparse_s=sample_sparse_us * SECONDS_PER_US,
            max_tokens_per_rank=cluster.max_tokens_per_rank,
        )

    # --- FLOPs of one sample ------------------------------------------------------------
    def full_attention_flops(self, length: NDArray[np.float64]) -> NDArray[np.float64]:
        """Causal full attention of one layer, forward + backward."""
        return FWD_BWD_FLOPS_PER_MAC * length**2 * self.heads * self.head_dim

    def sparse_attention_flops(self, length: NDArray[np.float64]) -> NDArray[np.float64]:
        """Sliding-window attention of one layer; full attention below the window."""
        w = self.window
        windowed = 2 * FWD_BWD_FLOPS_PER_MAC * self.heads * self.head_dim * (w * length - w**2 / 2)
        return np.where(length >= w, windowed, self.full_attention_flops(length))

    # --- communication -------------------------------------------------------------------
    def a2a_bytes_per_token(self, group: int) -> float:
        """Bytes one token moves in a Ulysses all-to-all pair (QKV out, O back), fwd + bwd."""
        heads_moved = 2 * self.heads + 2 * max(self.kv_heads, group)
        return heads_moved * self.head_dim * self.dtype_bytes * ALL_TO_ALL_PASSES

    def inter_node_share(self, group: int) -> float:
        return (group - min(group, self.gpus_per_node)) / group

    def a2a_seconds_per_token(self, group: int) -> float:
        """All-to-all time per token owned by the slowest rank of a group of ``group`` ranks."""
        table = self._a2a_table
        return table[group] if group in table else self._a2a_formula(group)

    @functools.cached_property
    def _a2a_table(self) -> dict[int, float]:
        """Memoised per power-of-two group size: planners ask for the same few millions of times."""
        sizes = [1 << i for i in range(self.world_size.bit_length())]
        return {k: self._a2a_formula(k) for k in sizes}

    def _a2a_formula(self, group: int) -> float:
        if group <= 1:
            return 0.0
        bpt = self.a2a_bytes_per_token(group)
        inter = bpt * self.inter_node_share(group) / self.inter_bytes_per_s
        intra = bpt * (min(group, self.gpus_per_node) - 1) / group / self.intra_bytes_per_s
        return max(inter, intra)

    def collective_seconds(self, group: int) -> float:
        """Fixed latency one layer pays for its all-to-all calls in a group of ``group``."""
        return self.call_latency_seconds(group) + self.peer_latency_seconds(group)

    def call_latency_seconds(self, group: int) -> float:
        """The part of ``collective_seconds`` that every call pays whatever its group."""
        return COLLECTIVES_PER_LAYER * self.collective_latency_s if group > 1 else 0.0

    def peer_latency_seconds(self, group: int) -> float:
        """The part of ``collective_seconds`` that grows with the group's peers."""
        if group <= 1:
            return 0.0
        return COLLECTIVES_PER_LAYER * self.collective_peer_latency_s * (group - 1)

    def layer_fixed_seconds(self, group: int) -> float:
        """Fixed time of one layer in a group of ``group`` ranks: its all-to-all calls' latency
        and the per-layer compute overhead (both 0 by default)."""
        table = self._tables[0]
        return table[group] if group in table else self._fixed_formula(group)

    def _fixed_formula(self, group: int) -> float:
        return self.collective_seconds(group) + self.layer_overhead_s

    def token_seconds(self, group: int) -> float:
        """Per token owned by a group's busiest rank, one layer: linear work plus all-to-all."""
        table = self._tables[1]
        return table[group] if group in table else self._token_formula(group)

    def _token_formula(self, group: int) -> float:
        return self.linear_seconds_per_token + self.a2a_seconds_per_token(group)

    @functools.cached_property
    def _tables(self) -> tuple[dict[int, float], dict[int, float]]:
        """``layer_fixed_seconds`` and ``token_seconds`` memoised per power-of-two group: the
        node stage and the child packer ask for them millions of times per request (the same
        float operations, so the same bits)."""
        sizes = [1 << i for i in range(self.world_size.bit_length())]
        return (
            {k: self._fixed_formula(k) for k in sizes},
            {k: self._token_formula(k) for k in sizes},
        )

    @functools.cached_property
    def linear_seconds_per_token(self) -> float:
        return self.linear_flops_per_token / self.linear_flops_per_s


@dataclass(frozen=True)
class SampleCosts:
    """Per-sample seconds of one layer on one rank, and token counts."""

    tokens: NDArray[np.int64]
    full_s: NDArray[np.float64]
    """Full attention of one full layer, on one rank."""
    sparse_s: NDArray[np.float64]
    """Sparse attention of one sparse layer, on one rank."""
    model_flops: float
    """Whole step, all samples, forward + backward (for MFU)."""
    full_attention_s: NDArray[np.float64]
    """``full_s`` without the per-sample overhead (``sample_full_s``): per token it never
    falls with the length, which the bounds' fractional fillers (the shortest samples first)
    rely on. With the overhead a short sample costs more per token than a longer one."""
    sparse_attention_s: NDArray[np.float64]
    """``sparse_s`` without the per-sample overhead (``sample_sparse_s``), as above."""

    @classmethod
    def build(cls, cost: CostModel, lengths: Sequence[int]) -> SampleCosts:
        tokens = np.asarray(lengths, dtype=np.int64)
        length = tokens.astype(np.float64)
        full = cost.full_attention_flops(length)
        sparse = cost.sparse_attention_flops(length)
        linear_total = cost.linear_flops_per_token * float(length.sum())
        layers = cost.full_layers + cost.sparse_layers
        model_flops = (
            cost.full_layers * float(full.sum())
            + cost.sparse_layers * float(sparse.sum())
            + layers * linear_total
        )
        full_attention = full / cost.full_flops_per_s
        sparse_attention = sparse / cost.sparse_flops_per_s
        return cls(
            tokens=tokens,
            full_s=full_attention + cost.sample_full_s,
            sparse_s=sparse_attention + cost.sample_sparse_s,
            model_flops=model_flops,
            full_attention_s=full_attention,
            sparse_attention_s=sparse_attention,
        )


def full_layer_seconds(cost: CostModel, size: int, full_s: float, max_tokens: int) -> float:
    """One full layer of a parent: attention spread over P, the busiest rank's linear work and
    its to_full + to_child all-to-all."""
    fixed, per_token = cost._tables
    return (
        full_s / size
        + max_tokens * (per_token[size] if size in per_token else cost._token_formula(size))
        + (fixed[size] if size in fixed else cost._fixed_formula(size))
    )


def child_layer_seconds(cost: CostModel, size: int, sparse_s: float, tokens: int) -> float:
    """One sparse layer of a child of ``size`` ranks holding ``tokens`` tokens. The node stage
    and the child searches call this (and ``full_layer_seconds``) millions of times per
    request: the tables are read inline, the same float operations as ``token_seconds`` and
    ``layer_fixed_seconds``, so the same bits."""
    if tokens == 0:
        return 0.0
    fixed, per_token = cost._tables
    return (
        sparse_s / size
        + -(-tokens // size) * (per_token[size] if size in per_token else cost._token_formula(size))
        + (fixed[size] if size in fixed else cost._fixed_formula(size))
    )


def parent_seconds(
    cost: CostModel,
    size: int,
    full_s: float,
    children: Sequence[tuple[int, float, int]],
) -> float:
    """Step time of one parent; ``children`` are ``(size, sparse_s, tokens)`` triples."""
    max_tokens, sparse = 0, 0.0
    for k, s, t in children:
        max_tokens = max(max_tokens, -(-t // k))
        sparse = max(sparse, child_layer_seconds(cost, k, s, t))
    return (
        cost.full_layers * full_layer_seconds(cost, size, full_s, max_tokens)
        + cost.sparse_layers * sparse
    )


def unrepacked_parent_seconds(
    cost: CostModel, size: int, full_s: float, sparse_s: float, tokens: int
) -> float:
    """The baseline layout of a parent: one child equal to the whole parent (``parent_seconds``
    of that one child)."""
    return cost.full_layers * full_layer_seconds(
        cost, size, full_s, -(-tokens // size)
    ) + cost.sparse_layers * child_layer_seconds(cost, size, sparse_s, tokens)


def inter_node_bytes(cost: CostModel, group: int, rank_tokens: Sequence[int]) -> float:
    """Bytes a group's ranks send to other nodes in one all-to-all pair (fwd + bwd)."""
    return cost.a2a_bytes_per_token(group) * cost.inter_node_share(group) * float(sum(rank_tokens))


def mfu(cost: CostModel, model_flops: float, step_s: float) -> float:
    return model_flops / (step_s * cost.world_size * cost.peak_flops_per_s)
