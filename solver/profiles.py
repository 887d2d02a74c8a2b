"""Profiles: the cost model's calibratable constants, and the one source of every default.

A ``Profile`` holds what a calibration measures on a cluster (compute efficiency per part of
the model, all-to-all bandwidths, a fixed latency per collective). ``DEFAULT_PROFILE`` is the
illustrative H100-class machine of docs/design.md; ``CLUSTER_DEFAULTS`` and ``MODEL_DEFAULTS``
are the defaults of ``ClusterSpec`` and ``ModelSpec`` (schema.py reads its ``Field`` defaults
from them), and the named cluster / model presets a request may give as ``"cluster":
"default"`` are built from them. Every physical quantity has a plausible range (``*_RANGE``):
about a factor of 1000 around today's hardware, so that a typo is an error, not an overflow
deep inside a solve.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, StrictInt

from solver.input_limits import FewUnknownKeys

# --- plausible ranges (inclusive unless noted), shared by Profile and ClusterSpec ---------------
PEAK_TFLOPS_RANGE = (0.0001, 1_000_000.0)
"""Peak dense TFLOP/s per GPU: today's ~1,000 (H100 989) up to a factor of 1000 more; down to
0.0001 because ``repack calibrate`` on a CPU (tests, the toy model) measures ~0.001-0.1."""
EFFICIENCY_RANGE = (0.01, 1.0)
"""Achieved share of peak; the lower end is exclusive (below 1% is a unit mistake)."""
BANDWIDTH_GBPS_RANGE = (0.01, 100_000.0)
"""All-to-all GB/s per rank, intra- or inter-node: today's ~20-900, a factor of 1000 around."""
LATENCY_US_RANGE = (0.0, 100_000.0)
"""Fixed cost of one collective, microseconds: 0 (pure bandwidth model) up to 0.1 s."""
MAX_TOKENS_PER_RANK_LIMIT = 1 << 24
"""Activation memory of one rank in tokens; 2^24 (16M) is far beyond any GPU today."""

INTER_NODE_SLOWDOWN = 7.0
"""Inter-node all-to-all is ~7x slower than intra-node (the paper's measurement)."""

PositiveTflops = Annotated[
    float,
    Field(ge=PEAK_TFLOPS_RANGE[0], le=PEAK_TFLOPS_RANGE[1], allow_inf_nan=False),
]
Efficiency = Annotated[
    float, Field(gt=EFFICIENCY_RANGE[0], le=EFFICIENCY_RANGE[1], allow_inf_nan=False)
]
Bandwidth = Annotated[
    float,
    Field(ge=BANDWIDTH_GBPS_RANGE[0], le=BANDWIDTH_GBPS_RANGE[1], allow_inf_nan=False),
]
LatencyUs = Annotated[
    float, Field(ge=LATENCY_US_RANGE[0], le=LATENCY_US_RANGE[1], allow_inf_nan=False)
]


PROFILE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""A profile's name is a path segment (``/v1/profiles/{name}``) and a database string."""


class Profile(FewUnknownKeys):
    """The cost model's constants for one cluster (what ``repack calibrate`` fits).

    Fields left out of a profile file take the default profile's values, so a partial
    profile (say, only measured bandwidths) is valid.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        "default",
        min_length=1,
        max_length=100,
        pattern=PROFILE_NAME_PATTERN,
        description="Name the profile is stored and referred to by.",
    )
    version: StrictInt | None = Field(
        None, ge=1, description="Version of a stored profile (set by the service), if any."
    )
    job_version: StrictInt | None = Field(
        None,
        ge=1,
        description="Version of the job's refitted constants that replaced this profile's "
        "(set by the service for a job that opted in to feedback), if any.",
    )
    peak_tflops: PositiveTflops = Field(989.0, description="Peak dense TFLOP/s per GPU.")
    efficiency_full_attention: Efficiency = Field(
        0.55, description="Achieved share of peak in full (causal) attention."
    )
    efficiency_sparse_attention: Efficiency = Field(
        0.55, description="Achieved share of peak in sliding-window attention."
    )
    efficiency_linear: Efficiency = Field(
        0.55, description="Achieved share of peak in projections and active experts (MoE)."
    )
    intra_node_gbps: Bandwidth = Field(160.0, description="All-to-all GB/s inside a node.")
    inter_node_gbps: Bandwidth = Field(
        160.0 / INTER_NODE_SLOWDOWN, description="All-to-all GB/s across nodes."
    )
    collective_latency_us: LatencyUs = Field(
        0.0, description="Fixed time of one all-to-all call, on top of its bytes / bandwidth."
    )
    collective_latency_us_per_peer: LatencyUs = Field(
        0.0,
        description="Fixed time of one all-to-all call per peer beyond the first: a call in a "
        "group of k ranks costs collective_latency_us + (k - 1) x this (v1 addition; 0 by "
        "default).",
    )
    layer_overhead_us: LatencyUs = Field(
        0.0,
        description="Fixed compute time of one layer (forward + backward) on a rank, whatever "
        "its tokens: kernel launches, framework dispatch (v1 addition; 0 by default).",
    )
    sample_overhead_us_full: LatencyUs = Field(
        0.0,
        description="Fixed time per sample of one full-attention layer, spread over the group "
        "like the attention's own work (v1 addition; 0 by default).",
    )
    sample_overhead_us_sparse: LatencyUs = Field(
        0.0,
        description="Fixed time per sample of one sliding-window layer, spread like "
        "``sample_overhead_us_full`` (v1 addition; 0 by default).",
    )


DEFAULT_PROFILE = Profile()
"""The design's illustrative constants; a request without a profile is planned with these
(or with its cluster's own bandwidths, peak and efficiency, see ``ClusterSpec``)."""

CLUSTER_DEFAULTS: dict[str, Any] = {
    "nodes": 8,
    "gpus_per_node": 8,
    "intra_node_gbps": DEFAULT_PROFILE.intra_node_gbps,
    "inter_node_gbps": DEFAULT_PROFILE.inter_node_gbps,
    "peak_tflops": DEFAULT_PROFILE.peak_tflops,
    "compute_efficiency": DEFAULT_PROFILE.efficiency_linear,
    "max_tokens_per_rank": 32768,
}
"""Defaults of every ``ClusterSpec`` field (H100-class nodes of 8 GPUs)."""

MODEL_DEFAULTS: dict[str, Any] = {
    "layers": 48,
    "pattern": "FSSS",
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "sparse_window": 4096,
    "moe_active_params": 151e6,
    "dtype_bytes": 2,
}
"""Defaults of every ``ModelSpec`` field (a 48-layer 1F3S hybrid MoE model)."""

CLUSTER_PROFILES: dict[str, dict[str, Any]] = {"default": CLUSTER_DEFAULTS}
"""Named cluster presets (``"cluster": "default"`` or ``{"profile": "default", ...}``)."""

MODEL_PROFILES: dict[str, dict[str, Any]] = {"default": MODEL_DEFAULTS}
"""Named model presets."""
