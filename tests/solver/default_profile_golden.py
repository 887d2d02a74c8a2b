"""Layouts and metrics recorded from the planner before profiles existed (``python -m
tests.solver.default_profile_golden`` rewrites the file). The test re-scores the recorded
layouts with today's cost model: the default profile must give the same numbers to the digit,
whatever the planner's search finds today."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path
from typing import Any

from solver.planner import plan
from solver.trace import load_trace
from tests.helpers import ROOT

GOLDEN = Path(__file__).parent / "data" / "default-profile-golden.json"
SCENARIO_DIRS = (ROOT / "scenarios", ROOT / "solver" / "scenarios")
"""Where the checkout keeps its scenario files (the second once they ship with the package)."""
SCENARIOS = (("gpu16-small.yaml", 4), ("gpu64-200steps.yaml", 2))
MODES = ("baseline", "sizing", "repack", "repack+parent", "repack+sizing")


def scenario_path(name: str) -> Path:
    """The checkout's scenario file ``name``, wherever the checkout keeps scenarios."""
    return next((d / name for d in SCENARIO_DIRS if (d / name).exists()), SCENARIO_DIRS[0] / name)


def record() -> list[dict[str, Any]]:
    entries = []
    for name, steps in SCENARIOS:
        for index, request in enumerate(islice(load_trace(scenario_path(name)), steps)):
            for mode in MODES:
                result = plan(request.model_copy(update={"mode": mode}))
                entries.append(
                    {
                        "scenario": name,
                        "step": index,
                        "mode": mode,
                        "parents": [p.ranks for p in result.parents],
                        "children": [
                            {"parent": c.parent, "ranks": c.ranks, "samples": c.samples}
                            for c in result.children
                        ],
                        "metrics": {
                            k: getattr(result.metrics, k)
                            for k in ("step_time_ms", "mfu", "inter_node_bytes")
                        },
                    }
                )
    return entries


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(record(), separators=(",", ":")) + "\n")
