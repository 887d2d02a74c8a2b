"""Named cluster and model profiles.

The numbers are docs/design.md's illustrative defaults (H100-class nodes of 8 GPUs, a 48-layer
1F3S hybrid MoE model); they are calibratable starting points, not measurements. A request names
a profile and may override any of its fields.
"""

from __future__ import annotations

from typing import Any

INTER_NODE_SLOWDOWN = 7.0
"""Inter-node all-to-all is ~7x slower than intra-node (the paper's measurement)."""

CLUSTER_PROFILES: dict[str, dict[str, Any]] = {
    "default": {
        "nodes": 8,
        "gpus_per_node": 8,
        "intra_node_gbps": 160.0,
        "inter_node_gbps": 160.0 / INTER_NODE_SLOWDOWN,
        "peak_tflops": 989.0,
        "compute_efficiency": 0.55,
        "max_tokens_per_rank": 32768,
    },
}

MODEL_PROFILES: dict[str, dict[str, Any]] = {
    "default": {
        "layers": 48,
        "pattern": "FSSS",
        "hidden": 4096,
        "heads": 32,
        "kv_heads": 8,
        "head_dim": 128,
        "sparse_window": 4096,
        "moe_active_params": 151e6,
        "dtype_bytes": 2,
    },
}
