"""The example trainer runs under torchrun (2 replicas x 2 ranks) against the real service
under uvicorn, and without a service (every plan from the fallback planner, said so)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.server import ServerThread, free_port
from api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServerThread]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'plans.db'}", port=free_port(), log_level="warning"
    )
    server = ServerThread(settings).start()
    yield server
    server.stop()


def _train(
    url: str, ranks: int, replicas: int, steps: int, *extra: str
) -> subprocess.CompletedProcess[str]:
    cmd = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", str(ranks), str(ROOT / "examples" / "train_toy.py")),
        *("--service-url", url, "--steps", str(steps), "--replicas", str(replicas)),
        *("--gpus-per-node", "2", "--retries", "0", *extra),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _replica_lines(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.splitlines() if line.strip().startswith("replica ")]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_replicas_train_through_the_iterator_with_a_service(service: ServerThread) -> None:
    done = _train(service.url, 4, 2, 3, "--job-id", "example")
    assert "4 ranks = 2 replicas x 2" in done.stdout
    steps = [line for line in done.stdout.splitlines() if re.fullmatch(r"step \d+", line)]
    assert steps == ["step 0", "step 1", "step 2"], done.stdout
    lines = [line for line in _replica_lines(done.stdout) if "loss" in line]
    assert len(lines) == 6 and all("via service" in line for line in lines), done.stdout
    assert {line.split(":")[0] for line in lines} == {"replica 0", "replica 1"}
    losses = [float(x) for line in lines for x in re.findall(r"loss (\d+\.\d+)", line)]
    assert len(losses) == 6
    assert all(0 < x < 10 for x in losses)
    assert "predicted" in lines[0] and "0 from the fallback planner" in done.stdout
    assert "NOTE" not in done.stdout
    # Every step's measured times are stored once per replica's job, beside its plan.
    for replica in (0, 1):
        assert f"replica {replica} measurements: 3 posted, 0 failed" in done.stdout
        listed = httpx.get(f"{service.url}/v1/jobs/example-r{replica}/measurements").json()
        assert [s["step"] for s in listed["steps"]] == [0, 1, 2]
        assert all(s["layers"]["full_ms"] > 0 and s["all_to_all_ms"] > 0 for s in listed["steps"])
        assert all(s["predicted_ms"] is not None for s in listed["steps"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_a_service_the_example_falls_back_and_says_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    done = _train(url, ranks=2, replicas=1, steps=2)
    lines = [line for line in _replica_lines(done.stdout) if "loss" in line]
    assert len(lines) == 2 and all("via fallback" in line for line in lines), done.stdout
    assert "0 from the service" in done.stdout
    assert "NOTE: the service at" in done.stdout and "fallback planner" in done.stdout
    assert "using the local planner" in done.stderr
    assert "replica 0 measurements: 0 posted, 2 failed" in done.stdout  # counted, not raised
