"""`repack demo`: serve on the embedded SQLite default, post a few steps, show the dashboard.

The steps are the first ``--steps`` of a trace (a scenario YAML or a directory of request
files, read by ``solver.trace``; default: the 64-GPU scenario). Keeps serving until Ctrl-C
unless ``--exit-after-posting``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from solver.trace import request_bodies

DEFAULT_TRACE = Path("scenarios/gpu64-200steps.yaml")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("demo", help="serve, post a few steps, print the dashboard URL")
    p.add_argument(
        "--trace",
        type=Path,
        default=DEFAULT_TRACE,
        help=f"scenario or request dir ({DEFAULT_TRACE})",
    )
    p.add_argument("--steps", type=int, default=20, help="steps to post (default 20)")
    p.add_argument("--job-id", default="demo", help="job id of the posted steps (default demo)")
    p.add_argument("--data-dir", type=Path, default=Path("repack-data"), help="SQLite dir")
    p.add_argument("--port", type=int, default=None, help="port (default REPACK_PORT or 8000)")
    p.add_argument("--exit-after-posting", action="store_true", help="stop once posted")
    p.set_defaults(run=run)


def post_steps(url: str, bodies: list[dict[str, Any]]) -> int:
    """POST each step, print one line per step; returns how many failed."""
    import httpx  # the api extra, imported only when a service command runs

    failed = 0
    with httpx.Client(base_url=url, timeout=120) as client:
        for body in bodies:
            start = time.perf_counter()
            r = client.post("/v1/plans", json=body)
            ms = (time.perf_counter() - start) * 1e3
            if r.status_code != 200:
                failed += 1
                print(f"step {body.get('step')}: HTTP {r.status_code} {r.text[:200]}")
                continue
            m = r.json()["metrics"]
            print(
                f"step {body.get('step'):>4}: {len(body['lengths']):>4} samples  "
                f"speed-up {m['speedup']:.3f}x  gap {m['gap']:.3f}  {ms:7.1f} ms"
            )
    return failed


def run(args: argparse.Namespace) -> int:
    from api.server import ServerThread  # the service stack, only for service commands
    from api.settings import Settings

    bodies = request_bodies(args.trace, args.steps, job_id=args.job_id)
    overrides: dict[str, Any] = {"database_url": f"sqlite:///{args.data_dir / 'repack.db'}"}
    if args.port is not None:
        overrides["port"] = args.port
    settings = Settings(**overrides)
    with ServerThread(settings) as server:
        failed = post_steps(server.url, bodies)
        job = bodies[0]["job_id"]
        print(
            f"\nDashboard: {server.url}/dashboard/jobs/{quote(job)}  (all: {server.url}/dashboard)"
        )
        if args.exit_after_posting:
            return 1 if failed else 0
        print("Serving until Ctrl-C ...")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 1 if failed else 0
