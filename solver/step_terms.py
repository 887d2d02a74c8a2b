"""A plan's predicted step time split by cost-model term: compute, intra-/inter-node, latency.

The cost model prices a step as its slowest parent; inside that parent every layer's time is a
sum of compute seconds (attention and linear/MoE FLOPs over the achieved rate) and all-to-all
seconds, each all-to-all priced by whichever link (intra- or inter-node) is slower for its group,
plus fixed seconds (collective latency per call and per peer, per-layer compute overhead).
Given the plan's layout that sum is linear in ``1 / rate``, ``1 / bandwidth`` and the fixed
times: this is what lets measured step times be regressed on the terms
(``solver.profile_feedback``) and what the dashboard's "dominating term" shows.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.cost_model import CostModel, SampleCosts, ceil_div
from solver.schema import Plan, PlanRequest

TERMS = ("compute", "intra", "inter", "latency", "peer_latency", "overhead")


@dataclass(frozen=True)
class StepTerms:
    """Seconds of the slowest parent's step, per term."""

    compute: float
    intra: float
    inter: float
    latency: float = 0.0
    """Fixed latency of the all-to-all calls (``Profile.collective_latency_us``)."""
    peer_latency: float = 0.0
    """Their latency per peer (``Profile.collective_latency_us_per_peer``)."""
    overhead: float = 0.0
    """Fixed compute time of the layers (``Profile.layer_overhead_us``)."""

    @property
    def total(self) -> float:
        return (
            self.compute
            + self.intra
            + self.inter
            + self.latency
            + self.peer_latency
            + self.overhead
        )

    @property
    def dominating(self) -> str:
        return max(TERMS, key=lambda t: (getattr(self, t), -TERMS.index(t)))

    def as_dict(self) -> dict[str, float]:
        return {t: getattr(self, t) for t in TERMS}


def _a2a_terms(cost: CostModel, group: int, tokens: int) -> tuple[float, float]:
    """(intra, inter) seconds of ``tokens`` tokens' all-to-all pair; only the slower link counts."""
    if group <= 1 or tokens == 0:
        return 0.0, 0.0
    s = cost.a2a_seconds_per_token(group) * tokens
    bpt = cost.a2a_bytes_per_token(group)
    inter = bpt * cost.inter_node_share(group) / cost.inter_bytes_per_s
    intra = bpt * (min(group, cost.gpus_per_node) - 1) / group / cost.intra_bytes_per_s
    return (0.0, s) if inter >= intra else (s, 0.0)


def _layer(cost: CostModel, size: int, attn_s: float, tokens: int) -> StepTerms:
    intra, inter = _a2a_terms(cost, size, tokens)
    compute = attn_s / size + tokens * cost.linear_seconds_per_token
    return StepTerms(
        compute,
        intra,
        inter,
        cost.call_latency_seconds(size),
        cost.peer_latency_seconds(size),
        cost.layer_overhead_s,
    )


def parent_terms(
    cost: CostModel, size: int, full_s: float, children: list[tuple[int, float, int]]
) -> StepTerms:
    """Terms of one parent; ``children`` are ``(size, sparse_s, tokens)`` as in the cost model."""
    max_tokens = max((ceil_div(t, k) for k, _, t in children), default=0)
    full = _layer(cost, size, full_s, max_tokens)
    sparse = StepTerms(0.0, 0.0, 0.0)
    for k, s, t in children:
        if t == 0:
            continue
        layer = _layer(cost, k, s, ceil_div(t, k))
        if layer.total > sparse.total:
            sparse = layer
    f, n = cost.full_layers, cost.sparse_layers
    return StepTerms(
        f * full.compute + n * sparse.compute,
        f * full.intra + n * sparse.intra,
        f * full.inter + n * sparse.inter,
        f * full.latency + n * sparse.latency,
        f * full.peer_latency + n * sparse.peer_latency,
        f * full.overhead + n * sparse.overhead,
    )


def step_terms(request: PlanRequest, plan: Plan, cost: CostModel | None = None) -> StepTerms:
    """Terms of the plan's slowest parent under ``cost`` (default: the request's profile).

    ``total`` equals the cost model's step time of the plan (``validate.step_seconds``)."""
    cost = cost or CostModel.from_request(request)
    costs = SampleCosts.build(cost, request.lengths)
    worst = StepTerms(0.0, 0.0, 0.0)
    for p in plan.parents:
        kids = [
            (
                c.ranks[1] - c.ranks[0],
                float(sum(costs.sparse_s[s] for s in c.samples)),
                sum(request.lengths[s] for s in c.samples),
            )
            for c in plan.children
            if c.parent == p.id
        ]
        full = float(sum(costs.full_s[s] for s in p.samples))
        terms = parent_terms(cost, p.ranks[1] - p.ranks[0], full, kids)
        if terms.total > worst.total:
            worst = terms
    return worst
