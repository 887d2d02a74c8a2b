"""`repack soak`: hours of traffic in minutes — does memory stay flat, does every key stay
solved once, does anything fail?

Starts ``--replicas`` `repack serve` processes on one PostgreSQL database (a fresh schema of
``--database-url``, dropped afterwards), then runs ``--loaders`` loader threads for
``--minutes``. Loaders come in pairs that post the same key sequence (like two ranks of one
job) round-robin over the replicas, so a key regularly reaches both replicas at once: the
cross-replica single flight is exercised on every new key. Half of the posts are new steps,
half replay an earlier key. A 429 or 503 is retried after its Retry-After, as the plan client
does (a 503 ``plan-in-progress`` says another replica is making the plan); an error is an
answer that stays a failure after 20 tries, or any other status.

Every ``--sample-s`` seconds it records each replica's resident memory (the process tree:
service, forkserver, solver workers). It prints one row per minute and a verdict against the
targets of docs/api.md: RSS flat within 10% (last sample vs the first after warm-up, and the
peak of the second half), 0 errors, every key solved once (from the replicas' per-plan log
lines) and byte-identical answers per key.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.bench_service import pct
from cli.errors import InputError
from cli.output import format_table
from cli.replicas import Replica
from solver.trace import request_bodies

DEFAULT_TRACE = Path("scenarios/gpu64-200steps.yaml")
POSTGRES_ENV = "REPACK_TEST_POSTGRES_URL"
WARMUP_SHARE = 0.1
"""The first tenth of the run warms caches and pools; the RSS baseline is taken after it."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("soak", help="long-running load on replicas: memory, errors, keys")
    p.add_argument("--minutes", type=float, default=10.0, help="duration (default 10)")
    p.add_argument("--loaders", type=int, default=8, help="loader threads (default 8)")
    p.add_argument("--replicas", type=int, default=2, help="repack serve processes (default 2)")
    p.add_argument("--workers", type=int, default=1, help="solver workers per replica")
    p.add_argument(
        "--database-url",
        default=os.environ.get(POSTGRES_ENV),
        help=f"PostgreSQL URL; a fresh schema is used and dropped (default ${POSTGRES_ENV})",
    )
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="steps to post")
    p.add_argument("--deadline-ms", type=int, default=1000, help="deadline_ms of every step")
    p.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling interval")
    p.add_argument("--log-dir", type=Path, default=None, help="keep the replicas' logs here")
    p.set_defaults(run=run)


@dataclass
class Tally:
    """What the loaders saw, shared under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    latencies: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    throttled: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    errors: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    error_examples: list[str] = field(default_factory=list)
    bodies: dict[str, str] = field(default_factory=dict)
    mismatched: int = 0

    def answer(self, minute: int, key: str, seconds: float, body: bytes) -> None:
        digest = hashlib.sha256(body).hexdigest()
        with self.lock:
            self.latencies[minute].append(seconds)
            if self.bodies.setdefault(key, digest) != digest:
                self.mismatched += 1

    def error(self, minute: int, what: str) -> None:
        with self.lock:
            self.errors[minute] += 1
            if len(self.error_examples) < 5:
                self.error_examples.append(what)


def _loader(
    pair: int,
    seed: int,
    urls: list[str],
    bodies: list[dict[str, Any]],
    stop_at: float,
    started: float,
    tally: Tally,
) -> None:
    """Post the pair's key sequence: step k of job ``soak-{pair}``, new or replayed."""
    import httpx

    rng = random.Random(seed)
    clients = [httpx.Client(base_url=u, timeout=120) for u in urls]
    step = 0
    try:
        while time.monotonic() < stop_at:
            if step > 0 and rng.random() < 0.5:
                k = rng.randrange(step)
            else:
                k = step  # both loaders of a pair post new keys in the same order
                step += 1
            body = {**bodies[k % len(bodies)], "job_id": f"soak-{pair}", "step": k}
            client = clients[(k + seed) % len(clients)]  # a pair's two loaders: two replicas
            minute = int((time.monotonic() - started) // 60)
            _post(client, body, minute, tally)
    finally:
        for c in clients:
            c.close()


def _post(client: Any, body: dict[str, Any], minute: int, tally: Tally) -> None:
    import httpx

    key = f"{body['job_id']}-{body['step']}"
    for _ in range(20):
        t0 = time.perf_counter()
        try:
            r = client.post("/v1/plans", json=body)
        except httpx.HTTPError as exc:
            tally.error(minute, f"{key}: {type(exc).__name__}")
            return
        if r.status_code in (429, 503) and "retry-after" in r.headers:
            with tally.lock:
                tally.throttled[minute] += 1
            time.sleep(min(2.0, float(r.headers.get("retry-after", "1"))))
            continue
        if r.status_code != 200:
            tally.error(minute, f"{key}: HTTP {r.status_code} {r.text[:120]}")
            return
        tally.answer(minute, key, time.perf_counter() - t0, r.content)
        return
    tally.error(minute, f"{key}: still {r.status_code} after 20 tries")


def _sample_rss(replicas: list[Replica], stop_at: float, every_s: float) -> list[list[int]]:
    samples: list[list[int]] = []
    while time.monotonic() < stop_at:
        samples.append([r.rss_bytes() for r in replicas])
        time.sleep(every_s)
    samples.append([r.rss_bytes() for r in replicas])
    return samples


def solves_per_key(logs: list[Path]) -> dict[str, int]:
    """How many times the replicas logged solving each plan id (their per-plan log lines)."""
    counts: dict[str, int] = defaultdict(int)
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"source": "solved"' in line:
                counts[json.loads(line)["plan_id"]] += 1
    return counts


def rss_drift(samples: list[list[int]]) -> list[tuple[float, float]]:
    """Per replica: (last / baseline - 1, peak of the second half / baseline - 1), where the
    baseline is the first sample after the warm-up share of the run."""
    start = min(len(samples) - 1, max(1, round(len(samples) * WARMUP_SHARE)))
    half = len(samples) // 2
    out = []
    for i in range(len(samples[0])):
        base = samples[start][i] or 1
        peak = max(s[i] for s in samples[half:])
        out.append((samples[-1][i] / base - 1, peak / base - 1))
    return out


@contextmanager
def fresh_schema(base_url: str) -> Iterator[str]:
    """A new PostgreSQL schema of ``base_url`` for this run, dropped afterwards."""
    from sqlalchemy import create_engine, text

    schema = f"repack_soak_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base_url else "?"
    try:
        yield f"{base_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def run(args: argparse.Namespace) -> int:
    if not args.database_url or not args.database_url.startswith("postgresql"):
        raise InputError(f"--database-url must be a PostgreSQL URL (or set ${POSTGRES_ENV})")
    bodies = request_bodies(args.trace, 200)
    for body in bodies:
        body["deadline_ms"] = args.deadline_ms
    with fresh_schema(args.database_url) as url, tempfile.TemporaryDirectory() as tmp:
        logs = args.log_dir or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        replicas = [
            Replica(url, logs / f"replica-{i}.log", workers=args.workers)
            for i in range(args.replicas)
        ]
        try:
            for r in replicas:
                r.start()
            tally, samples, seconds = _drive(args, replicas, bodies)
            solves = solves_per_key([r.log_path for r in replicas])
        finally:
            for r in replicas:
                r.stop()
    return _report(args, tally, samples, solves, seconds)


def _drive(
    args: argparse.Namespace, replicas: list[Replica], bodies: list[dict[str, Any]]
) -> tuple[Tally, list[list[int]], float]:
    tally = Tally()
    started = time.monotonic()
    stop_at = started + args.minutes * 60
    urls = [r.url for r in replicas]
    threads = [
        threading.Thread(
            target=_loader, args=(i // 2, i, urls, bodies, stop_at, started, tally), daemon=True
        )
        for i in range(args.loaders)
    ]
    for t in threads:
        t.start()
    samples = _sample_rss(replicas, stop_at, args.sample_s)
    for t in threads:
        t.join(timeout=300)
    return tally, samples, time.monotonic() - started


def _report(
    args: argparse.Namespace,
    tally: Tally,
    samples: list[list[int]],
    solves: dict[str, int],
    seconds: float,
) -> int:
    minutes = sorted(set(tally.latencies) | set(tally.errors))
    rows = [
        [
            str(m),
            str(len(tally.latencies[m])),
            f"{pct(tally.latencies[m], 50) * 1e3:.0f}",
            f"{pct(tally.latencies[m], 99) * 1e3:.0f}",
            str(tally.throttled[m]),
            str(tally.errors[m]),
        ]
        for m in minutes
    ]
    print(
        f"soak: {args.loaders} loaders, {args.replicas} replicas x {args.workers} workers on "
        f"PostgreSQL, {seconds / 60:.1f} min"
    )
    header = ["minute", "answers", "p50 ms", "p99 ms", "429/503 retried", "errors"]
    print(format_table(header, rows))
    drift = rss_drift(samples)
    mib = [[f"{b / 2**20:.0f}" for b in s] for s in (samples[0], samples[-1])]
    for i, (last, peak) in enumerate(drift):
        print(
            f"replica {i}: RSS {mib[0][i]} -> {mib[1][i]} MiB; vs baseline after warm-up: "
            f"last {last:+.1%}, second-half peak {peak:+.1%}"
        )
    errors = sum(tally.errors.values())
    twice = {k: n for k, n in solves.items() if n > 1}
    flat = all(abs(last) <= 0.10 and peak <= 0.10 for last, peak in drift)
    print(f"keys {len(tally.bodies)}, solved {len(solves)}, solved more than once {len(twice)}")
    print(f"errors {errors}, answers differing for one key {tally.mismatched}")
    for example in tally.error_examples:
        print(f"  e.g. {example}")
    ok = flat and errors == 0 and not twice and tally.mismatched == 0
    print(f"verdict: {'PASS' if ok else 'FAIL'} (RSS flat within 10%, 0 errors, solved once)")
    return 0 if ok else 1
