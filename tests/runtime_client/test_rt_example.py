"""The example trainer runs under torchrun against a real HTTP plan service (small world)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rt_service import PlanService, ServiceBehaviour

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_toy_under_torchrun() -> None:
    service = PlanService(ServiceBehaviour())
    try:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "4",
            "--standalone",
            str(ROOT / "examples" / "train_toy.py"),
            "--service-url",
            service.url,
            "--steps",
            "3",
            "--gpus-per-node",
            "2",
            "--parent-sizes",
            "4",
            "--tokens-per-step",
            "200",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    finally:
        service.close()
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 3 and all("via service" in line for line in lines), done.stdout
    assert "3 from the service, 0 from the fallback planner" in done.stdout
    assert sorted(s or 0 for _, _, s in service.behaviour.seen) == [0, 1, 2]
