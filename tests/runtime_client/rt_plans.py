"""Hand-built plans for layouts a test needs exactly (the planner decides its own layouts).

The layout is given as parents of children of samples; tokens, cu_seqlens and split sizes are
derived with the packing rule, and ``solver.validate.validate_plan`` checks the result, so a
hand-built plan obeys the same rules as a planned one."""

from __future__ import annotations

from typing import Any

from solver.schema import Plan, PlanRequest
from solver.validate import validate_plan

ChildSpec = tuple[int, list[int]]
"""(size, samples in packing order); children are laid out left to right inside the parent."""


def _split(total: int, size: int) -> list[int]:
    return [(i + 1) * total // size - i * total // size for i in range(size)]


def hand_plan(
    lengths: list[int],
    parents: list[list[ChildSpec]],
    *,
    gpus_per_node: int = 8,
    heads: int = 16,
    kv_heads: int = 4,
    max_tokens_per_rank: int = 64,
) -> Plan:
    """A valid Plan for the given layout (raises AssertionError if it breaks a layout rule)."""
    parents_out: list[dict[str, Any]] = []
    children_out: list[dict[str, Any]] = []
    tokens: list[int] = []
    cu_all: list[list[int]] = []
    full_in: list[list[int]] = []
    full_out: list[list[int]] = []
    at = 0
    for j, children in enumerate(parents):
        start = at
        samples: list[int] = []
        for size, members in children:
            children_out.append(
                {
                    "id": len(children_out),
                    "parent": j,
                    "node": at // gpus_per_node,
                    "ranks": [at, at + size],
                    "samples": members,
                }
            )
            tokens += _split(sum(lengths[s] for s in members), size)
            samples += members
            at += size
        parents_out.append({"id": j, "ranks": [start, at], "samples": samples})
        cu = [0]
        for s in samples:
            cu.append(cu[-1] + lengths[s])
        cu_all.append(cu)
        owned = tokens[start:at]
        for r in range(start, at):
            full_in.append([tokens[r]] * (at - start))
            full_out.append(list(owned))
    plan = Plan.model_validate(
        {
            "plan_id": "hand",
            "mode": "repack",
            "status": "feasible",
            "parents": parents_out,
            "children": children_out,
            "tokens": tokens,
            "cu_seqlens": cu_all,
            "all_to_all": {
                "to_full": {"input_split_sizes": full_in, "output_split_sizes": full_out},
                "to_child": {"input_split_sizes": full_out, "output_split_sizes": full_in},
            },
            "metrics": {
                "step_time_ms": 1,
                "baseline_step_time_ms": 1,
                "speedup": 1,
                "mfu": 0,
                "baseline_mfu": 0,
            },
        }
    )
    request = PlanRequest.model_validate(
        {
            "cluster": {
                "nodes": max(1, at // gpus_per_node),
                "gpus_per_node": gpus_per_node,
                "max_tokens_per_rank": max_tokens_per_rank,
            },
            "model": {"heads": heads, "kv_heads": kv_heads, "head_dim": 8},
            "lengths": lengths,
            "parent_sizes": [p["ranks"][1] - p["ranks"][0] for p in parents_out],
            "mode": "repack",
        }
    )
    errors = [e for e in validate_plan(request, plan) if not e.startswith("metrics")]
    assert errors == [], errors
    return plan
