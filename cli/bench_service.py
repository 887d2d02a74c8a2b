"""`repack bench-service`: latency, throughput and 429 rate of a real server under load.

Starts `repack serve` in a subprocess on a free loopback port (fresh SQLite file), then runs 1, 8
and 32 concurrent loaders, each posting new 64-GPU steps; measures the in-process ``plan()`` on
the same requests for the service overhead, and replays stored keys for the idempotent-replay
latency. Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solver.planner import plan
from solver.schema import PlanRequest
from solver.trace import request_bodies

DEFAULT_TRACE = Path("scenarios/gpu64-200steps.yaml")

READY_TIMEOUT_S = 60.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("bench-service", help="load-test a real plan service")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=96, help="new steps per concurrency level")
    p.add_argument("--replays", type=int, default=200, help="idempotent replays per level")
    p.add_argument(
        "--trace", type=Path, default=DEFAULT_TRACE, help=f"steps to post (default {DEFAULT_TRACE})"
    )
    p.add_argument("--deadline-ms", type=int, default=None, help="deadline_ms of every step")
    p.add_argument("--queue-limit", type=int, default=None, help="REPACK_QUEUE_LIMIT of the server")
    p.set_defaults(run=run)


@dataclass(frozen=True)
class Sample:
    index: int
    """Which body was posted."""
    status: int
    seconds: float
    solve_ms: float | None
    """The plan's own ``metrics.solve_ms`` (wall time of ``plan()`` inside the worker)."""


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


@dataclass(frozen=True)
class Server:
    url: str
    pid: int

    def cpu_seconds(self) -> float:
        """CPU time the server's main process used so far (Linux /proc; NaN elsewhere).

        Solver workers are separate processes, so this is the service's own cost: HTTP,
        validation, idempotency, storage.
        """
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        # utime and stime are fields 14 and 15 of stat(5); index 11 and 12 after the name.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def served(extra_env: dict[str, str] | None = None) -> Iterator[Server]:
    """`repack serve` in a subprocess on a fresh SQLite file."""
    with tempfile.TemporaryDirectory(prefix="repack-bench-") as tmp:
        from api.server import free_port  # the service stack, only when benchmarking it

        port = free_port()
        env = {
            **os.environ,
            "REPACK_DATABASE_URL": f"sqlite:///{tmp}/bench.db",
            "REPACK_PORT": str(port),
            "REPACK_HOST": "127.0.0.1",
            "REPACK_LOG_LEVEL": "warning",
            **(extra_env or {}),
        }
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve"], env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, proc)
            yield Server(url, proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    import httpx  # the api extra, imported only when a service command runs

    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"repack serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"repack serve not ready on {url}")


async def _load(url: str, bodies: list[dict[str, Any]], concurrency: int) -> list[Sample]:
    """``concurrency`` loaders share the bodies; each posts its next one when answered."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(bodies)):
        queue.put_nowait(i)
    import httpx

    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def loader() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                start = time.perf_counter()
                r = await client.post("/v1/plans", json=bodies[i])
                seconds = time.perf_counter() - start
                solve_ms = r.json()["metrics"]["solve_ms"] if r.status_code == 200 else None
                samples.append(Sample(i, r.status_code, seconds, solve_ms))

        await asyncio.gather(*(loader() for _ in range(concurrency)))
    return samples


def _measure(
    server: Server, bodies: list[dict[str, Any]], concurrency: int
) -> tuple[list[Sample], str]:
    """Run one load and format its table row."""
    cpu0, start = server.cpu_seconds(), time.perf_counter()
    samples = asyncio.run(_load(server.url, bodies, concurrency))
    wall_s, cpu_s = time.perf_counter() - start, server.cpu_seconds() - cpu0
    ok = [s.seconds * 1e3 for s in samples if s.status == 200]
    n = len(samples)
    rejected = sum(s.status == 429 for s in samples)
    row = (
        f"| {concurrency} | {n} | {pct(ok, 50):.1f} | {pct(ok, 99):.1f} | {len(ok) / wall_s:.1f} | "
        f"{100 * rejected / n:.1f}% | {n - len(ok) - rejected} | {cpu_s / n * 1e3:.2f} |"
    )
    return samples, row


def in_process_p50_ms(bodies: list[dict[str, Any]]) -> float:
    """p50 of ``plan()`` called directly on the same requests (validation included).

    Objects alive now are frozen out of the garbage collector first, so this process's larger
    heap (HTTP client, request bodies) does not slow ``plan()`` down compared to a worker's.
    """
    gc.collect()
    gc.freeze()
    plan(PlanRequest.model_validate(bodies[0]))  # warm-up: first-call costs are not the solve
    times = []
    for body in bodies:
        start = time.perf_counter()
        plan(PlanRequest.model_validate(body))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(args: argparse.Namespace) -> int:
    header = (
        "| loaders | requests | p50 ms | p99 ms | answers/s | 429 rate | other errors "
        "| server CPU ms/req |"
    )
    rule = "|---|---|---|---|---|---|---|---|"
    solve_rows, replay_rows = [header, rule], [header, rule]
    overhead: list[str] = []
    env = {} if args.queue_limit is None else {"REPACK_QUEUE_LIMIT": str(args.queue_limit)}
    with served(env) as server:
        for c in args.concurrency:
            bodies = request_bodies(args.trace, args.requests, job_id=f"bench-c{c}")
            if args.deadline_ms is not None:
                bodies = [{**b, "deadline_ms": args.deadline_ms} for b in bodies]
            samples, row = _measure(server, bodies, c)
            solve_rows.append(row)
            if c == 1:
                overhead += _overhead(samples, bodies)
            stored = [bodies[s.index] for s in samples if s.status == 200]
            replays = (stored * (args.replays // max(1, len(stored)) + 1))[: args.replays]
            replay_rows.append(_measure(server, replays, c)[1])
    deadline = f"deadline_ms {args.deadline_ms}" if args.deadline_ms else "default deadline"
    queue = "default queue limit" if args.queue_limit is None else f"queue limit {args.queue_limit}"
    print(f"New steps of {args.trace} (each a fresh solve, {deadline}, {queue}):")
    print("\n".join(solve_rows))
    print("\nIdempotent replays of stored steps:")
    print("\n".join(replay_rows))
    print("\n" + "\n".join(overhead))
    return 0


def _overhead(samples: list[Sample], bodies: list[dict[str, Any]]) -> list[str]:
    """Service overhead over the in-process solve, two ways (see docs/api.md)."""
    http_p50 = pct([s.seconds * 1e3 for s in samples if s.status == 200], 50)
    local_p50 = in_process_p50_ms(bodies)
    paired = [s.seconds * 1e3 - s.solve_ms for s in samples if s.solve_ms is not None]
    return [
        f"HTTP p50 {http_p50:.1f} ms - in-process plan() p50 {local_p50:.1f} ms "
        f"= service overhead {http_p50 - local_p50:.1f} ms",
        f"per request, HTTP latency - the plan's own solve_ms: p50 "
        f"{pct(paired, 50):.1f} ms, p99 {pct(paired, 99):.1f} ms",
    ]
