"""Turn a layout into the wire-format Plan (contract v1): tokens, cu_seqlens, split sizes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from solver.cost_model import CostModel, mfu
from solver.layout import Layout, LayoutEval, Parent, split_tokens
from solver.schema import (
    AllToAll,
    ChildOut,
    Metrics,
    Mode,
    ParentOut,
    Plan,
    PlanProfile,
    PlanRequest,
    SplitSizes,
    Status,
    StoppedBy,
)

METRIC_DIGITS = 10
"""Significant digits kept in metrics: readable JSON, yet exact enough to re-check at any
scale (a toy cluster's step takes microseconds)."""


def _round(x: float) -> float:
    return float(f"{x:.{METRIC_DIGITS}g}")


@dataclass(frozen=True)
class SolveOutcome:
    """What a planner reports besides the layout."""

    layout: Layout
    evaluation: LayoutEval
    baseline: LayoutEval
    lower_bound_s: float
    status: Status
    stopped_by: StoppedBy


def request_digest(request: PlanRequest) -> str:
    """Stable id of a request's content: the same request gives the same plan_id anywhere."""
    body = request.model_dump_json(exclude={"deadline_ms"})
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def plan_id_for(request: PlanRequest, mode: Mode) -> str:
    if request.job_id is not None and request.step is not None:
        return f"{request.job_id}-{request.step}"
    return f"{mode}-{request_digest(request)}"


def rank_tokens(layout: Layout, world_size: int, tokens_of: list[int]) -> list[int]:
    out = [0] * world_size
    for p in layout:
        for c in p.children:
            total = sum(tokens_of[s] for s in c.samples)
            out[c.start : c.start + c.size] = split_tokens(total, c.size)
    return out


def _cu_seqlens(parent: Parent, tokens_of: list[int]) -> list[int]:
    cu = [0]
    for s in parent.samples:
        cu.append(cu[-1] + tokens_of[s])
    return cu


def _split_sizes(layout: Layout, tokens: list[int]) -> AllToAll:
    """to_full: rank i sends its n_i tokens (one head slice each) to every rank of its parent."""
    to_full_in: list[list[int]] = [[] for _ in tokens]
    to_full_out: list[list[int]] = [[] for _ in tokens]
    for p in layout:
        owned = tokens[p.start : p.start + p.size]
        for r in range(p.start, p.start + p.size):
            to_full_in[r] = [tokens[r]] * p.size
            to_full_out[r] = list(owned)
    return AllToAll(
        to_full=SplitSizes(input_split_sizes=to_full_in, output_split_sizes=to_full_out),
        to_child=SplitSizes(input_split_sizes=to_full_out, output_split_sizes=to_full_in),
    )


def build_plan(
    request: PlanRequest,
    mode: Mode,
    outcome: SolveOutcome,
    cost: CostModel,
    model_flops: float,
    solve_ms: float,
) -> Plan:
    tokens_of = list(request.lengths)
    layout = outcome.layout
    tokens = rank_tokens(layout, cost.world_size, tokens_of)
    parents: list[ParentOut] = []
    children: list[ChildOut] = []
    for j, p in enumerate(layout):
        parents.append(ParentOut(id=j, ranks=[p.start, p.start + p.size], samples=list(p.samples)))
        for c in p.children:
            children.append(
                ChildOut(
                    id=len(children),
                    parent=j,
                    node=c.start // cost.gpus_per_node,
                    ranks=[c.start, c.start + c.size],
                    samples=list(c.samples),
                )
            )
    step, base = outcome.evaluation.step_s, outcome.baseline.step_s
    lb = min(outcome.lower_bound_s, step)
    metrics = Metrics(
        step_time_ms=_round(step * 1e3),
        baseline_step_time_ms=_round(base * 1e3),
        speedup=_round(base / step),
        mfu=_round(mfu(cost, model_flops, step)),
        baseline_mfu=_round(mfu(cost, model_flops, base)),
        imbalance=_round(outcome.evaluation.imbalance),
        inter_node_bytes=round(outcome.evaluation.inter_node_bytes),
        lower_bound_ms=_round(lb * 1e3),
        gap=_round((step - lb) / step),
        solve_ms=round(solve_ms, 3),
        stopped_by=outcome.stopped_by,
    )
    return Plan(
        plan_id=plan_id_for(request, mode),
        mode=mode,
        status=outcome.status,
        job_id=request.job_id,
        step=request.step,
        parents=parents,
        children=children,
        tokens=tokens,
        cu_seqlens=[_cu_seqlens(p, tokens_of) for p in layout],
        all_to_all=_split_sizes(layout, tokens),
        metrics=metrics,
        profile=PlanProfile.of(request),
    )


def canonical_json(plan: Plan, *, drop_timing: bool = False) -> str:
    """Byte-stable JSON of a plan; ``drop_timing`` removes the measured ``solve_ms``."""
    data = plan.model_dump(mode="json")
    if drop_timing:
        data["metrics"].pop("solve_ms", None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))
