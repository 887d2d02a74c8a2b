"""The trace generator: deterministic per (seed, step), and it hits its documented statistics."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from solver.schema import ClusterSpec, PlanRequest
from solver.trace import LengthDistribution, Scenario, TraceSpec, load_trace
from tests.helpers import ROOT

SCENARIOS = ROOT / "solver" / "scenarios"
CLUSTER64 = ClusterSpec(nodes=8)


def test_step_depends_only_on_seed_and_step() -> None:
    spec = TraceSpec(seed=7, steps=5)
    in_order = [spec.step_lengths(s, CLUSTER64) for s in range(5)]
    assert spec.step_lengths(3, CLUSTER64) == in_order[3]  # drawn alone
    assert TraceSpec(seed=7, steps=50).step_lengths(3, CLUSTER64) == in_order[3]
    assert TraceSpec(seed=8).step_lengths(3, CLUSTER64) != in_order[3]
    assert in_order[2] != in_order[3]


def test_scenario_requests_carry_job_and_step() -> None:
    spec = TraceSpec(seed=1, steps=3, first_step=10)
    requests = list(Scenario(job_id="j", cluster=CLUSTER64, trace=spec).requests())
    assert [(r.job_id, r.step) for r in requests] == [("j", 10), ("j", 11), ("j", 12)]
    assert requests[1].lengths == spec.step_lengths(11, CLUSTER64)


def test_batches_fill_their_budget() -> None:
    spec = TraceSpec(seed=3, fill=0.6)
    budget = spec.budget(CLUSTER64)
    assert budget == int(0.6 * 64 * 32768)
    for step in range(50):
        total = sum(spec.step_lengths(step, CLUSTER64))
        assert 0.99 * budget <= total <= budget


def test_lengths_follow_the_documented_distribution() -> None:
    dist = LengthDistribution()
    x = dist.draw(np.random.default_rng(0), 1_000_000)
    assert x.min() >= dist.min_length and x.max() <= dist.max_length
    assert x.mean() == pytest.approx(dist.mean_length(), rel=0.03)
    assert np.median(x) == pytest.approx(dist.body_median, rel=0.02)
    for length in (8192, 32768, 131072):
        assert (x > length).mean() == pytest.approx(dist.exceeds(length), rel=0.15)
    assert (x >= dist.tail_min).mean() == pytest.approx(
        dist.tail_prob + (1 - dist.tail_prob) * dist.body_exceeds(dist.tail_min), rel=0.1
    )


def test_samples_per_step_match_budget_over_mean_length() -> None:
    spec = TraceSpec(seed=5)
    counts = [len(spec.step_lengths(s, CLUSTER64)) for s in range(100)]
    expected = spec.budget(CLUSTER64) / spec.lengths.mean_length()
    assert np.mean(counts) == pytest.approx(expected, rel=0.05)


def test_parameters_validate_with_exact_messages() -> None:
    with pytest.raises(ValidationError, match=r"min_length \(9\) must be <= max_length \(8\)"):
        LengthDistribution(min_length=9, max_length=8, tail_min=8)
    with pytest.raises(ValidationError, match="exceeds the widest parent's capacity"):
        Scenario(cluster=ClusterSpec(nodes=1), trace=TraceSpec())  # 512k > 8 x 32768
    with pytest.raises(ValidationError, match="fill"):
        TraceSpec(fill=1.5)


def test_scenario_files_load_and_fit_memory() -> None:
    for path in sorted(SCENARIOS.glob("*.yaml")):
        scenario_steps = list(islice(load_trace(path), 3))
        assert scenario_steps, path
        for request in scenario_steps:
            cluster = request.cluster
            share = 1.0 if request.parent_of is not None else 0.7  # packed loaders fill memory
            assert sum(request.lengths) <= share * cluster.world_size * cluster.max_tokens_per_rank
            assert max(request.lengths) <= 32 * cluster.max_tokens_per_rank


def test_gpu64_scenario_has_the_documented_shape() -> None:
    requests = list(load_trace(SCENARIOS / "gpu64-200steps.yaml"))
    assert len(requests) == 200
    assert {r.cluster.world_size for r in requests} == {64}
    assert 380 <= np.mean([len(r.lengths) for r in requests]) <= 440
    # Longer than a node's memory (8 x 32768): such a step cannot use parents of 8.
    beyond_node = sum(max(r.lengths) > 8 * 32768 for r in requests)
    assert 3 <= beyond_node <= 20


def test_packed_loader_fills_every_parent_and_gives_its_membership() -> None:
    requests = list(load_trace(SCENARIOS / "gpu64-packed.yaml"))
    assert len(requests) == 200
    for r in requests:
        assert r.parent_sizes is not None and r.parent_of is not None
        assert len(set(r.parent_sizes)) == 1 and sum(r.parent_sizes) == 64
        cap = r.parent_sizes[0] * r.cluster.max_tokens_per_rank
        load = [0] * len(r.parent_sizes)
        for n, j in zip(r.lengths, r.parent_of, strict=True):
            load[j] += n
        assert all(0.99 * cap <= t <= cap for t in load)
        # the loader keeps room beside the longest sample unless no parent is wide enough
        assert max(r.lengths) <= 0.5 * cap or r.parent_sizes[0] == 32
    sizes = [r.parent_sizes[0] for r in requests if r.parent_sizes]
    assert sizes.count(32) >= 3 and sizes.count(16) >= 3 and sizes.count(8) >= 100


def test_packed_steps_depend_only_on_seed_and_step() -> None:
    data = {
        "cluster": {"nodes": 2},
        "trace": {"seed": 3, "steps": 4, "loader": {"min_fill": 0.95}},
    }
    alone = list(
        Scenario.model_validate({**data, "trace": {**data["trace"], "first_step": 2}}).requests()
    )
    in_order = list(Scenario.model_validate(data).requests())
    assert alone[0].lengths == in_order[2].lengths and alone[0].parent_of == in_order[2].parent_of
    with pytest.raises(ValidationError, match=r"a trace\.loader chooses the parent sizes"):
        Scenario.model_validate({**data, "parent_sizes": [8, 8]})


def test_load_trace_reads_directories_and_single_requests(tmp_path: Path) -> None:
    first = PlanRequest(job_id="d", step=0, lengths=[5, 6])
    (tmp_path / "b.json").write_text(first.model_dump_json(exclude_none=True))
    (tmp_path / "a.yaml").write_text("job_id: d\nstep: 1\nlengths: [7]\n")
    (tmp_path / "notes.txt").write_text("ignored")
    assert [r.lengths for r in load_trace(tmp_path)] == [[7], [5, 6]]  # sorted by file name
    assert [r.lengths for r in load_trace(tmp_path / "b.json")] == [[5, 6]]


def test_load_trace_names_the_bad_file_in_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"lengths": [1]}))
    (tmp_path / "b.json").write_text(json.dumps({"lengths": [0]}))
    with pytest.raises(ValidationError) as info:
        list(load_trace(tmp_path))
    assert info.value.__notes__ == [f"in {tmp_path / 'b.json'}"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no request files"):
        list(load_trace(empty))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("body_median", 1e308),
        ("body_median", float("inf")),
        ("body_sigma", float("nan")),
        ("tail_alpha", 1e-300),
        ("tail_alpha", 1e6),
    ],
)
def test_length_parameters_that_overflow_a_draw_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        LengthDistribution(**{field: value})


@pytest.mark.parametrize(
    "params",
    [
        {"body_median": 2.0**31, "body_sigma": 5.0},
        {"body_median": 1e-9, "body_sigma": 5.0},
        {"tail_alpha": 0.05, "tail_prob": 1.0, "tail_min": 1, "max_length": 2**31},
        {"tail_alpha": 20.0, "tail_prob": 1.0, "tail_min": 1, "max_length": 2**31},
        {"tail_alpha": 1.0, "tail_prob": 0.5, "tail_min": 7, "max_length": 7, "min_length": 1},
    ],
)
def test_extreme_length_parameters_draw_without_floating_point_errors(
    params: dict[str, float],
) -> None:
    """At the bounds every draw and the mean are finite (numpy raises instead of warning)."""
    dist = LengthDistribution(**params)
    with np.errstate(all="raise"):
        lengths = dist.draw(np.random.default_rng(0), 10_000)
        mean = dist.mean_length()
    assert lengths.min() >= dist.min_length and lengths.max() <= dist.max_length
    assert np.isfinite(mean) and mean > 0
