"""`repack serve`, `repack demo` and `repack bench-service`, run as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from api.server import free_port
from cli.bench_service import served
from cli.main import build_parser
from tests.api.conftest import SMALL_REQUEST
from tests.helpers import ROOT

SMALL_TRACE = ROOT / "solver" / "scenarios" / "gpu16-small.yaml"


def repack(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_commands_are_registered() -> None:
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"serve", "demo", "bench-service"} <= set(sub)


def test_serve_answers_health_and_plans() -> None:
    with served() as server:
        assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
        r = httpx.post(f"{server.url}/v1/plans", json={**SMALL_REQUEST, "job_id": "s", "step": 0})
        assert r.status_code == 200
        assert r.json()["plan_id"] == "s-0"


def test_demo_posts_steps_and_is_idempotent_on_rerun(tmp_path: Path) -> None:
    args = ("demo", "--exit-after-posting", "--steps", "3", "--trace", str(SMALL_TRACE))
    data = ("--data-dir", str(tmp_path / "data"))
    first = repack(*args, *data, "--port", str(free_port()))
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("speed-up") == 3
    assert "/dashboard/jobs/demo" in first.stdout
    assert (tmp_path / "data" / "repack.db").exists()
    again = repack(*args, *data, "--port", str(free_port()))
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("speed-up") == 3


def test_demo_reads_request_files(tmp_path: Path) -> None:
    requests = tmp_path / "requests"
    requests.mkdir()
    for i in range(2):
        (requests / f"step-{i}.json").write_text(json.dumps(SMALL_REQUEST))
    result = repack(
        "demo", "--exit-after-posting", "--trace", str(requests), "--job-id", "files",
        "--data-dir", str(tmp_path / "data"), "--port", str(free_port()),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("speed-up") == 2
    assert "/dashboard/jobs/files" in result.stdout


@pytest.mark.slow
def test_bench_service_prints_its_tables() -> None:
    result = repack(
        "bench-service", "--concurrency", "1", "2", "--requests", "3", "--replays", "4",
        "--trace", str(SMALL_TRACE), "--deadline-ms", "500",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.count("| loaders | requests | p50 ms | p99 ms |") == 2
    assert "deadline_ms 500" in out
    assert "service overhead" in out
    rows = [line for line in out.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 2


def test_dockerfile_runs_the_service_as_non_root() -> None:
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    assert "HEALTHCHECK" in dockerfile and "/healthz" in dockerfile
    assert "USER " in dockerfile
    assert 'CMD ["repack", "serve"]' in dockerfile
