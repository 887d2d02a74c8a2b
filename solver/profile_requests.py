"""Price a request with a calibrated profile (before the contract carries profiles inline)."""

from __future__ import annotations

from typing import Any

from solver.schema import PlanRequest


def priced_request(request: PlanRequest, profile: dict[str, Any]) -> PlanRequest:
    """``request`` with its cluster's constants replaced by ``profile``'s (one efficiency: the
    FLOP-weighted one, ``compute_efficiency``; no per-collective latency)."""
    cluster = request.cluster.model_copy(
        update={
            "peak_tflops": profile["peak_tflops"],
            "compute_efficiency": profile["compute_efficiency"],
            "intra_node_gbps": profile["intra_node_gbps"],
            "inter_node_gbps": profile["inter_node_gbps"],
        }
    )
    return request.model_copy(update={"cluster": cluster})
