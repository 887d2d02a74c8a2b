"""`repack demo`: serve on the embedded SQLite default, post a few steps, show the dashboard.

Steps are ~20 random long-tailed 64-GPU batches made in code, or the request files (JSON or
YAML) of ``--requests DIR`` in name order. Keeps serving until Ctrl-C unless
``--exit-after-posting``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from api.server import ServerThread
from api.settings import Settings
from cli.synthetic import synthetic_requests
from solver.io import load_document

REQUEST_SUFFIXES = (".json", ".yaml", ".yml")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("demo", help="serve, post a few steps, print the dashboard URL")
    p.add_argument("--requests", type=Path, default=None, help="directory of request files")
    p.add_argument("--steps", type=int, default=20, help="synthetic steps (default 20)")
    p.add_argument("--nodes", type=int, default=8, help="nodes of 8 GPUs (default 8)")
    p.add_argument("--job-id", default="demo", help="job id of steps that name none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=Path("repack-data"), help="SQLite dir")
    p.add_argument("--port", type=int, default=None, help="port (default REPACK_PORT or 8000)")
    p.add_argument("--exit-after-posting", action="store_true", help="stop once posted")
    p.set_defaults(run=run)


def load_requests(directory: Path, job_id: str) -> list[dict[str, Any]]:
    """Request files in name order; a file without ``job_id``/``step`` gets ours/its index."""
    files = sorted(p for p in directory.iterdir() if p.suffix in REQUEST_SUFFIXES)
    if not files:
        raise SystemExit(f"repack demo: no request files (*.json, *.yaml) in {directory}")
    bodies = []
    for i, path in enumerate(files):
        body = dict(load_document(path))
        body.setdefault("job_id", job_id)
        body.setdefault("step", i)
        bodies.append(body)
    return bodies


def post_steps(url: str, bodies: list[dict[str, Any]]) -> int:
    """POST each step, print one line per step; returns how many failed."""
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
    if args.requests is not None:
        bodies = load_requests(args.requests, args.job_id)
    else:
        bodies = synthetic_requests(args.job_id, args.steps, nodes=args.nodes, seed=args.seed)
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
