"""The planner's entry point: a PlanRequest in, a valid Plan out, for every mode.

Pipeline (each stage deterministic; the wall-clock deadline is only a safety net):

1. parent sizes: the request's, or derived (``parent_sizing``);
2. baseline membership: the request's ``parent_of``, or the balanced default;
3. mode ``repack``: children for that membership, parent by parent, critical parent first;
4. mode ``repack+parent``: membership re-balanced for repacking, children again; the better of
   this and step 3 is returned, so the modes are ordered baseline >= repack >= repack+parent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from solver.bounds import membership_free_bound
from solver.children import polish, solve_children
from solver.deadline import Deadline
from solver.layout import Layout, LayoutEval, baseline_layout, evaluate
from solver.membership import Objective, balance, members_from_parent_of
from solver.parent_sizing import derive_parent_sizes
from solver.plan_builder import SolveOutcome, build_plan
from solver.problem import Problem
from solver.schema import Mode, Plan, PlanRequest, StoppedBy

DEFAULT_DEADLINE_MS = 1000

UPSTREAM_OBJECTIVE: Objective = "tokens"
"""The default membership (no ``parent_of``) models a data loader that balances tokens per
rank across parents, as loaders without a cost model do; the baseline is measured on it."""
GAP_TOLERANCE = 1e-9


@dataclass(frozen=True)
class _Candidate:
    layout: Layout
    evaluation: LayoutEval
    lower_bound_s: float


def _baseline_parents(problem: Problem, request: PlanRequest) -> tuple[list[int], list[list[int]]]:
    """Parent sizes and the baseline membership: the request's, else derived and balanced."""
    if request.parent_sizes is not None:
        sizes = list(request.parent_sizes)
        if request.parent_of is not None:
            return sizes, members_from_parent_of(request.parent_of, len(sizes))
        return sizes, balance(problem, sizes, UPSTREAM_OBJECTIVE)
    sizes, greedy = derive_parent_sizes(problem, request)
    return sizes, balance(problem, sizes, UPSTREAM_OBJECTIVE, start=greedy)


def plan(request: PlanRequest, deadline_ms: float | None = None) -> Plan:
    """Solve one step. ``deadline_ms`` overrides the request's (and the default)."""
    t0 = time.perf_counter()
    budget = deadline_ms or request.deadline_ms or DEFAULT_DEADLINE_MS
    deadline = Deadline(budget)
    mode: Mode = request.resolved_mode
    problem = Problem.from_request(request)
    sizes, base_members = _baseline_parents(problem, request)
    base_layout = baseline_layout(sizes, base_members)
    base_eval = evaluate(base_layout, problem.cost, problem.costs)

    if mode == "baseline":
        fixed = request.parent_of is not None
        lb = base_eval.step_s if fixed else membership_free_bound(problem, sizes, repack=False)
        best = _Candidate(base_layout, base_eval, lb)
    else:
        chosen = solve_children(problem, sizes, base_members, deadline)
        if mode in ("repack+parent", "repack+sizing") and not deadline.expired():
            members = balance(problem, sizes, "repack", start=base_members)
            moved = solve_children(problem, sizes, members, deadline)
            if moved.evaluation.step_s < chosen.evaluation.step_s:
                chosen = moved
        chosen = polish(problem, chosen, deadline)
        lb = max(chosen.parent_bounds)
        if mode != "repack":
            # The membership is a decision here: only a bound over all memberships is true.
            lb = membership_free_bound(problem, sizes, repack=True)
        best = _Candidate(chosen.layout, chosen.evaluation, lb)
    outcome = _outcome(best, base_eval, deadline)
    return build_plan(
        request,
        mode,
        outcome,
        problem.cost,
        problem.costs.model_flops,
        solve_ms=(time.perf_counter() - t0) * 1e3,
    )


def _outcome(best: _Candidate, base: LayoutEval, deadline: Deadline) -> SolveOutcome:
    step = best.evaluation.step_s
    lb = min(best.lower_bound_s, step)
    proven = step - lb <= GAP_TOLERANCE * step
    stopped: StoppedBy = "optimal" if proven else ("deadline" if deadline.fired else "work_limit")
    return SolveOutcome(
        layout=best.layout,
        evaluation=best.evaluation,
        baseline=base,
        lower_bound_s=lb,
        status="optimal" if proven else "feasible",
        stopped_by=stopped,
    )
