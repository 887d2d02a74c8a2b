"""`repack calibrate`'s fit report: every measured and unmeasured term gets a full row."""

from __future__ import annotations

from cli.calibrate import fit_report
from solver.calibration_profile import AllToAllPoint, ComputePoint, FittedProfile, fit_profile
from solver.cost_model import CostModel
from solver.schema import ClusterSpec, ModelSpec


def _single_node_fit() -> FittedProfile:
    """What one node measures: intra-node all-to-alls only, no inter-node link."""
    model = ModelSpec(layers=4, hidden=32, heads=16, kv_heads=4, head_dim=8, sparse_window=16,
                      moe_active_params=4096, dtype_bytes=4)  # fmt: skip
    cost = CostModel.from_specs(ClusterSpec(nodes=1, gpus_per_node=2), model)
    compute = []
    for length in (16, 32, 64):
        compute.append(ComputePoint(part="linear", length=length, seconds=1e-4 + length * 1e-6))
        for part, per in (("full_attention", 4e-8), ("sparse_attention", 2e-8)):
            compute.append(ComputePoint(part=part, length=length, seconds=1e-4 + per * length**2))
    a2a = [
        AllToAllPoint(group=2, gpus_per_node=2, bytes_per_rank=b, seconds=1e-4 + b / 1e9)
        for b in (1e3, 1e5, 1e6)
    ]
    return fit_profile(cost, a2a, compute, peak_tflops=0.01)


def test_a_single_node_report_names_the_unmeasured_link_in_a_full_row() -> None:
    fitted = _single_node_fit()
    assert "inter" not in fitted.fits
    report = fit_report(fitted)
    rows = [line for line in report.splitlines() if line.startswith("|")]
    widths = {line.count("|") for line in rows}
    assert len(widths) == 1, report  # every row has the header's columns
    inter = next(line for line in rows if line.startswith("| inter"))
    assert "not measured" in inter
