"""Check a plan against the layout rules (docs/design.md section 3) and recompute its metrics.

Written apart from the planners on purpose: it shares only the request schema and the cost
model's formulas with them, so a planner bug cannot hide behind the validator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from solver.cost_model import CostModel, SampleCosts, inter_node_bytes, mfu, parent_seconds
from solver.schema import CHILD_SIZES, ChildOut, Plan, PlanRequest, parent_size_error

REL_TOL = 1e-4
"""Metrics are compared with this relative tolerance (plans round them for the wire; the
contract example keeps 3 decimals of milliseconds and 4 of ratios)."""

SIZING_MODES = ("sizing", "repack+sizing")
"""Modes that choose their own parent sizes (the request's are only the baseline's)."""


def _close(a: float, b: float, abs_tol: float = 0.0) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=abs_tol)


def _floor_split(total: int, size: int) -> list[int]:
    return [(i + 1) * total // size - i * total // size for i in range(size)]


def validate_plan(request: PlanRequest, plan: Plan) -> list[str]:
    """Every violated rule, one line each; an empty list means the plan is valid."""
    errors: list[str] = []
    g = request.cluster.gpus_per_node
    lengths = request.lengths

    errors += _check_parents(request, plan)
    if errors:
        return errors  # the remaining rules need a sound parent tiling

    seen: dict[int, int] = {}
    for child in plan.children:
        where = f"child {child.id}"
        if not 0 <= child.parent < len(plan.parents):
            errors.append(f"{where}: parent {child.parent} does not exist")
            continue
        p = plan.parents[child.parent]
        p_start, p_end = p.ranks
        start, end = child.ranks
        size = end - start
        if not (p_start <= start < end <= p_end):
            errors.append(f"{where}: ranks {child.ranks} are not inside parent {p.id} {p.ranks}")
            continue
        whole_parent = (start, end) == (p_start, p_end)
        if not whole_parent:
            if size not in CHILD_SIZES or size > g:
                errors.append(f"{where}: size {size} is not one of 1/2/4/8 within a node of {g}")
            if start % size != 0:
                errors.append(f"{where}: start {start} is not aligned to its size {size}")
            if start // g != (end - 1) // g:
                errors.append(f"{where}: ranks {child.ranks} span more than one node")
        if child.node != start // g:
            errors.append(f"{where}: node {child.node}, but rank {start} is on node {start // g}")
        for s in child.samples:
            if not 0 <= s < len(lengths):
                errors.append(f"{where}: sample {s} does not exist")
            elif s in seen:
                errors.append(f"sample {s} is in child {seen[s]} and child {child.id}")
            else:
                seen[s] = child.id
    missing = [s for s in range(len(lengths)) if s not in seen]
    if missing:
        errors.append(f"samples {missing[:10]} are in no child")
    if errors:
        return errors

    errors += _check_tiling(plan)
    errors += _check_tokens(request, plan)
    if not errors:
        errors += _check_metrics(request, plan)
    return errors


def _check_parents(request: PlanRequest, plan: Plan) -> list[str]:
    errors = []
    cluster, model = request.cluster, request.model
    at = 0
    for j, p in enumerate(plan.parents):
        start, end = p.ranks
        if p.id != j:
            errors.append(f"parent {j}: id is {p.id}, must be its index {j}")
        if start != at:
            errors.append(f"parent {j}: starts at rank {start}, must start at {at}")
        size = end - start
        why = parent_size_error(size, start, cluster, model) if size >= 1 else "is empty"
        if why is not None:
            errors.append(f"parent {j}: {why}")
        absent = [s for s in p.samples if not 0 <= s < len(request.lengths)]
        if absent:
            errors.append(f"parent {j}: samples {absent[:10]} do not exist")
        tokens = sum(request.lengths[s] for s in p.samples if 0 <= s < len(request.lengths))
        if size >= 1 and tokens > size * cluster.max_tokens_per_rank:
            errors.append(f"parent {j}: {tokens} tokens exceed its memory")
        at = end
    if at != cluster.world_size:
        errors.append(f"parents cover ranks [0, {at}), the cluster has {cluster.world_size}")
    sizes = [p.ranks[1] - p.ranks[0] for p in plan.parents]
    fixed_sizes = request.parent_sizes is not None and plan.mode not in SIZING_MODES
    if fixed_sizes and sizes != list(request.parent_sizes or []):
        errors.append(f"parent sizes {sizes} differ from the request's {request.parent_sizes}")
    if request.parent_of is not None and plan.mode in ("baseline", "repack"):
        wanted: dict[int, list[int]] = {}
        for s, q in enumerate(request.parent_of):
            wanted.setdefault(q, []).append(s)
        for j, p in enumerate(plan.parents):
            if sorted(p.samples) != wanted.get(j, []):
                errors.append(f"parent {j}: samples differ from the request's parent_of")
    return errors


def _children_of(plan: Plan) -> dict[int, list[ChildOut]]:
    """Each parent's children, in the plan's order: one pass, not one per parent (a plan of
    16,384 ranks took 157 s to validate with a scan of every child per parent)."""
    kids: dict[int, list[ChildOut]] = {p.id: [] for p in plan.parents}
    for c in plan.children:
        kids.setdefault(c.parent, []).append(c)
    return kids


def _check_tiling(plan: Plan) -> list[str]:
    errors = []
    children = _children_of(plan)
    for p in plan.parents:
        kids = sorted(children[p.id], key=lambda c: c.ranks[0])
        at = p.ranks[0]
        for c in kids:
            if c.ranks[0] != at:
                errors.append(f"parent {p.id}: children do not tile its ranks at rank {at}")
                break
            at = c.ranks[1]
        else:
            if at != p.ranks[1]:
                errors.append(f"parent {p.id}: children stop at rank {at}, not {p.ranks[1]}")
        packed = [s for c in kids for s in c.samples]
        if list(p.samples) != packed:
            errors.append(f"parent {p.id}: samples are not its children's in rank order")
    return errors


def _expected_tokens(request: PlanRequest, plan: Plan) -> list[int]:
    tokens = [0] * request.cluster.world_size
    for c in plan.children:
        total = sum(request.lengths[s] for s in c.samples)
        tokens[c.ranks[0] : c.ranks[1]] = _floor_split(total, c.ranks[1] - c.ranks[0])
    return tokens


def _check_tokens(request: PlanRequest, plan: Plan) -> list[str]:
    errors = []
    cap = request.cluster.max_tokens_per_rank
    tokens = _expected_tokens(request, plan)
    if plan.tokens != tokens:
        bad = next(
            r for r in range(len(tokens)) if r >= len(plan.tokens) or plan.tokens[r] != tokens[r]
        )
        errors.append(f"tokens[{bad}] does not follow the packing rule (expected {tokens[bad]})")
    over = [r for r, n in enumerate(tokens) if n > cap]
    if over:
        errors.append(f"ranks {over[:10]} own more than max_tokens_per_rank ({cap})")
    if len(plan.cu_seqlens) != len(plan.parents):
        errors.append("cu_seqlens must have one list per parent")
    else:
        for p, cu in zip(plan.parents, plan.cu_seqlens, strict=True):
            want = [0]
            for s in p.samples:
                want.append(want[-1] + request.lengths[s])
            if cu != want:
                errors.append(f"cu_seqlens of parent {p.id} do not match its packed samples")
    a2a = plan.all_to_all
    for p in plan.parents:  # they tile the ranks in order (``_check_parents``)
        owned = tokens[p.ranks[0] : p.ranks[1]]
        for r in range(p.ranks[0], p.ranks[1]):
            sends = [tokens[r]] * (p.ranks[1] - p.ranks[0])
            for name, got, want in (
                ("to_full.input_split_sizes", a2a.to_full.input_split_sizes, sends),
                ("to_full.output_split_sizes", a2a.to_full.output_split_sizes, owned),
                ("to_child.input_split_sizes", a2a.to_child.input_split_sizes, owned),
                ("to_child.output_split_sizes", a2a.to_child.output_split_sizes, sends),
            ):
                if r >= len(got) or got[r] != want:
                    errors.append(f"all_to_all.{name}[{r}] is wrong")
    return errors


def step_seconds(request: PlanRequest, plan: Plan, cost: CostModel, costs: SampleCosts) -> float:
    """Predicted step time of a plan, straight from the cost model's formulas."""
    worst = 0.0
    children = _children_of(plan)
    for p in plan.parents:
        kids = children[p.id]
        terms = [
            (
                c.ranks[1] - c.ranks[0],
                float(sum(costs.sparse_s[s] for s in c.samples)),
                sum(request.lengths[s] for s in c.samples),
            )
            for c in kids
        ]
        full = float(sum(costs.full_s[s] for s in p.samples))
        worst = max(worst, parent_seconds(cost, p.ranks[1] - p.ranks[0], full, terms))
    return worst


def _inter_bytes(plan: Plan, cost: CostModel) -> float:
    total = 0.0
    for p in plan.parents:
        size = p.ranks[1] - p.ranks[0]
        total += cost.full_layers * inter_node_bytes(
            cost, size, plan.tokens[p.ranks[0] : p.ranks[1]]
        )
    for c in plan.children:
        size = c.ranks[1] - c.ranks[0]
        total += cost.sparse_layers * inter_node_bytes(
            cost, size, plan.tokens[c.ranks[0] : c.ranks[1]]
        )
    return total


def _check_metrics(request: PlanRequest, plan: Plan) -> list[str]:
    errors = []
    cost = CostModel.from_request(request)
    costs = SampleCosts.build(cost, request.lengths)
    step_ms = step_seconds(request, plan, cost, costs) * 1e3
    m = plan.metrics
    if step_ms <= 0 or m.step_time_ms <= 0:
        return [f"metrics.step_time_ms = {m.step_time_ms}, the cost model gives {step_ms:.6g}"]
    if m.baseline_step_time_ms <= 0:
        return [f"metrics.baseline_step_time_ms = {m.baseline_step_time_ms} must be positive"]
    checks: Sequence[tuple[str, float, float, float]] = [
        ("step_time_ms", m.step_time_ms, step_ms, 0.0),
        ("mfu", m.mfu, mfu(cost, costs.model_flops, step_ms / 1e3), 1e-4),
        (
            "baseline_mfu",
            m.baseline_mfu,
            mfu(cost, costs.model_flops, m.baseline_step_time_ms / 1e3),
            1e-4,
        ),
        ("speedup", m.speedup, m.baseline_step_time_ms / step_ms, 1e-4),
    ]
    if m.inter_node_bytes is not None:
        checks = [*checks, ("inter_node_bytes", m.inter_node_bytes, _inter_bytes(plan, cost), 1.0)]
    for name, got, want, tol in checks:
        if not _close(got, want, tol):
            errors.append(f"metrics.{name} = {got}, the cost model gives {want:.6g}")
    if m.lower_bound_ms is not None and m.lower_bound_ms > step_ms * (1 + REL_TOL):
        errors.append(f"metrics.lower_bound_ms = {m.lower_bound_ms} exceeds the step time")
    if m.gap is not None and m.lower_bound_ms is not None:
        want_gap = (step_ms - m.lower_bound_ms) / step_ms
        if not _close(m.gap, want_gap, 1e-4):
            errors.append(f"metrics.gap = {m.gap}, step time and bound give {want_gap:.6g}")
    if plan.mode in ("baseline", "sizing") and any(
        len(kids) != 1 for kids in _children_of(plan).values()
    ):
        errors.append(f"mode {plan.mode}: every parent must be one child (unrepacked)")
    return errors
