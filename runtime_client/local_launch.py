"""Run a function on N local ranks (gloo, ``fork``) for tests, benchmarks and demos.

``fork`` matters: ``spawn`` re-imports torch in every child (~30 s for 16 ranks on 2 cores),
``fork`` starts 16 ranks in ~0.6 s. The parent must not have initialised ``torch.distributed``.
Results come back through a queue; any rank's exception is re-raised in the parent with every
failing rank's traceback, and a hung rank is killed after ``timeout_s`` instead of hanging CI.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class RankFailure(RuntimeError):
    """One or more ranks raised, exited abnormally or timed out."""


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    store_path: str,
    results: Any,
    args: tuple[Any, ...],
    timeout_s: float,
) -> None:
    status, payload = "ok", None
    try:
        # One intra-op thread per rank: N ranks share the machine's cores, and OpenMP pools
        # inherited through fork are not safe to use.
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        # Every rank's mesh is up before any rank goes on: a rank whose ``fn`` returns at once
        # exits and closes its sockets, and a peer still inside gloo's connectFullMesh then
        # fails with "Connection closed by peer" (seen once in CI on a 4-rank test whose
        # ``fn`` makes no collective call).
        dist.barrier()
        payload = fn(rank, world_size, *args)
    except BaseException:
        status, payload = "error", traceback.format_exc()
    try:
        results.put((rank, status, payload))
        results.close()
        results.join_thread()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        # os._exit: a forked pytest worker must not run the parent's atexit hooks.
        os._exit(0)


def pin_to_simulated_node(rank: int, gpus_per_node: int) -> int:
    """Pin this process to one core per simulated node (round robin over the cores it may use)
    and return that core.

    Unpinned, N local ranks share the cores however the scheduler likes: a rank blocked in a
    collective hands its core to whichever rank runs, so how fast a rank computes depends on
    the layout (which ranks wait when), which no cost model of a real cluster has. Pinned, the
    ranks of one simulated node share their node's core whatever the layout, as a real node's
    ranks share its host. Linux only (``os.sched_setaffinity``)."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[(rank // gpus_per_node) % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


def run_local_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 300.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` forked gloo ranks.

    Returns the per-rank return values (picklable) in rank order.
    """
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(fn, r, world_size, store_path, results, args, timeout_s),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        out: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(out) < world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    rank, status, payload = results.get(timeout=min(left, 1.0))
                    out[rank] = (status, payload)
                except queue.Empty:
                    if any(p.exitcode not in (None, 0) for p in procs):
                        break
        finally:
            for p in procs:
                p.join(timeout=5.0)
                if p.is_alive():
                    p.kill()
                    p.join()
    errors = [f"rank {r}:\n{payload}" for r, (s, payload) in sorted(out.items()) if s != "ok"]
    missing = sorted(set(range(world_size)) - set(out))
    if errors or missing:
        head = f"{len(errors)} rank(s) failed"
        if missing:
            head += f"; no result from ranks {missing} (crashed or timed out after {timeout_s} s)"
        raise RankFailure(head + "\n" + "\n".join(errors[:3]))
    return [out[r][1] for r in range(world_size)]
