"""Scale-out as users deploy it: a real nginx (deploy/'s configuration) in front of two
`repack serve` replicas on the test PostgreSQL; one replica is killed (-9, with its workers)
mid-run. Every key must be answered, solved once, and identical everywhere."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from cli.replicas import Nginx, Replica, nginx_binary
from tests.api.conftest import _postgres_schema, small_request

JOBS = [f"job-{i}" for i in range(6)]
STEPS = 6
LOADERS = 4
RETRIES = 20
"""A loader retries a 5xx or a dropped connection like the plan client does (after the kill,
keys the dead replica had claimed wait until its claim expires, a few seconds)."""

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def pg_schema_url(postgres_url: str) -> Iterator[str]:
    yield from _postgres_schema(postgres_url)


@pytest.fixture
def deployment(pg_schema_url: str, tmp_path: Path) -> Iterator[tuple[Nginx, list[Replica]]]:
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (scripts/ensure-test-services.sh installs it)")
    replicas = [
        Replica(pg_schema_url, tmp_path / f"replica-{i}.log", env={"REPACK_LOG_LEVEL": "info"})
        for i in range(2)
    ]
    nginx = Nginx(tmp_path / "nginx", [r.address for r in replicas])
    try:
        for r in replicas:
            r.start()
        nginx.start()
        yield nginx, replicas
    finally:
        nginx.stop()
        for r in replicas:
            r.stop()


def post_with_retries(client: httpx.Client, job: str, step: int) -> tuple[httpx.Response, int]:
    headers = {"X-Repack-Job": quote(job, safe="")}
    for attempt in range(RETRIES):
        try:
            r = client.post("/v1/plans", json=small_request(job, step), headers=headers)
        except httpx.TransportError:
            time.sleep(0.3)
            continue
        if r.status_code < 500 and r.status_code != 429:
            return r, attempt
        time.sleep(min(1.0, 0.1 * 2**attempt))
    raise AssertionError(f"{job}-{step}: no answer after {RETRIES} attempts")


def solves_logged(logs: list[Path]) -> dict[str, int]:
    """Plan ids and how many times a replica logged solving them."""
    counts: dict[str, int] = defaultdict(int)
    for log in logs:
        for line in log.read_text().splitlines():
            if line.startswith("{") and '"source": "solved"' in line:
                counts[json.loads(line)["plan_id"]] += 1
    return counts


def answered_jobs(log: Path) -> set[str]:
    """Jobs this replica answered, from its structured per-plan log lines."""
    jobs = set()
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"plan answered"' in line:
            jobs.add(json.loads(line)["job_id"])
    return jobs


def test_nginx_routes_by_job_and_survives_a_replica_kill(
    deployment: tuple[Nginx, list[Replica]],
) -> None:
    nginx, replicas = deployment
    keys = [(job, step) for job in JOBS for step in range(STEPS)]
    answers: dict[tuple[str, int], list[httpx.Response]] = defaultdict(list)
    lock = threading.Lock()
    done = threading.Event()

    # Warm-up: step 0 of every job, before any kill, shows the routing by job.
    with httpx.Client(base_url=nginx.url, timeout=60) as c:
        for job in JOBS:
            r, _ = post_with_retries(c, job, 0)
            answers[(job, 0)].append(r)
    per_replica = [answered_jobs(r.log_path) for r in replicas]
    assert not per_replica[0] & per_replica[1], per_replica  # each job met one replica
    assert per_replica[0] | per_replica[1] == set(JOBS)

    def loader(seed: int) -> None:
        order = keys[:]
        random.Random(seed).shuffle(order)
        with httpx.Client(base_url=nginx.url, timeout=60) as c:
            for job, step in order:
                r, _ = post_with_retries(c, job, step)
                with lock:
                    answers[(job, step)].append(r)
        done.set()

    threads = [threading.Thread(target=loader, args=(i,)) for i in range(LOADERS)]
    for t in threads:
        t.start()
    while sum(len(v) for v in answers.values()) < len(JOBS) + len(keys) and not done.is_set():
        time.sleep(0.01)
    victim, survivor = (replicas[0], replicas[1]) if per_replica[0] else (replicas[1], replicas[0])
    victim.kill()  # mid-run: about a quarter of the requests answered
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)

    with httpx.Client(timeout=60) as c:
        for key in keys:
            bodies = {r.content for r in answers[key]}
            assert all(r.status_code == 200 for r in answers[key]), key
            assert len(bodies) == 1, f"{key}: {len(bodies)} different plans"
            (body,) = bodies
            plan_id = json.loads(body)["plan_id"]
            assert c.get(f"{nginx.url}/v1/plans/{plan_id}").content == body
            assert c.get(f"{survivor.url}/v1/plans/{plan_id}").content == body
            solved = [r for r in answers[key] if r.headers["x-repack-plan-source"] == "solved"]
            assert len(solved) <= 1, f"{key} solved {len(solved)} times"
        steps = {
            job: [s["step"] for s in c.get(f"{survivor.url}/v1/jobs/{job}/steps").json()["items"]]
            for job in JOBS
        }
    assert steps == {job: list(range(STEPS)) for job in JOBS}  # stored once per key
    solves = solves_logged([r.log_path for r in replicas])
    assert max(solves.values()) == 1, {k: n for k, n in solves.items() if n > 1}
