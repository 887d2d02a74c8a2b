"""Measured vs predicted, per step: what the measurements API and the dashboard show."""

from __future__ import annotations

import json
from typing import Any

from api.profile_store import ProfileStore
from api.storage import PlanStore
from solver.schema import Plan, PlanRequest
from solver.step_terms import step_terms


def compare_steps(
    profiles: ProfileStore, plans: PlanStore, job_id: str, limit: int, after: int | None
) -> list[dict[str, Any]]:
    """One entry per measured step: measured and predicted ms, relative error, the predicted
    time split by term (under the profile the plan was priced with) and the dominating term."""
    rows = profiles.measurements(job_id, limit, after)
    requests = profiles.step_requests(job_id, [r.step for r in rows])
    out = []
    for m in rows:
        body = json.loads(m.body)
        entry: dict[str, Any] = {
            "step": m.step,
            "measured_ms": m.step_time_ms,
            "all_to_all_ms": m.all_to_all_ms,
            "layers": body.get("layers"),
            "predicted_ms": None,
            "error": None,
            "terms_ms": None,
            "dominating": None,
            "profile_version": None,
        }
        req = requests.get(m.step)
        stored = plans.get(f"{job_id}-{m.step}" if req is None else req.plan_id)
        if stored is None:
            out.append(entry)
            continue
        plan = Plan.model_validate_json(stored.body)
        predicted = plan.metrics.step_time_ms
        entry.update(predicted_ms=predicted, error=predicted / m.step_time_ms - 1.0)
        if req is not None:  # the request is known: split the prediction by term
            terms = step_terms(PlanRequest.model_validate_json(req.request), plan)
            entry.update(
                terms_ms={k: v * 1e3 for k, v in terms.as_dict().items()},
                dominating=terms.dominating,
                profile_version=req.profile_version,
            )
        out.append(entry)
    return out
