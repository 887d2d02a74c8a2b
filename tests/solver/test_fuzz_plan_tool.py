"""``bench/fuzz_plan.py`` keeps working: its requests are reproducible from the seed, and a
short run plans each in every mode and reports no finding on today's planner."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.fuzz_plan import MODES, check, main, random_request


def test_the_same_seed_draws_the_same_requests() -> None:
    a, b = random.Random(5), random.Random(5)
    for _ in range(6):
        ra, rb = random_request(a, 4000), random_request(b, 4000)
        assert (ra is None) == (rb is None)
        if ra is not None and rb is not None:
            assert ra.model_dump() == rb.model_dump()


def test_a_short_run_finds_nothing_and_reports_every_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "findings"
    assert main(["--seed", "7", "--requests", "3", "--max-samples", "600", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "0 findings" in printed
    for mode in MODES:
        assert f"| {mode} |" in printed
    assert not out.exists()  # nothing written without a finding


def test_check_returns_each_mode_s_step_time_in_order() -> None:
    rnd = random.Random(11)
    request = None
    while request is None:
        request = random_request(rnd, 300)
    steps, cpu, broken = check(request)
    assert set(steps) == set(cpu) == set(MODES)
    assert broken == []
    assert steps["repack+sizing"] <= steps["baseline"] * (1 + 1e-9)
