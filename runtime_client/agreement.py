"""Every rank of a repack domain runs the same plan: broadcast, digest check, validity flag.

Every rank must run the same layout, or the all-to-alls deadlock or corrupt data:

* the same request gives the same layout everywhere: the service keys plans by
  ``(job_id, step)`` and returns the stored plan for a repeated key; the fallback planner is
  deterministic (same request -> same layout in any process);
* that is necessary, not sufficient (a rank could fall back while the service runs a newer
  solver, or a wall-clock deadline could fire on one rank), so ``agree_on_plan`` all-gathers a
  SHA-256 of the plan's *layout* on every step and raises ``PlanMismatchError`` on every rank if
  any differs. Only the layout is hashed (``plan_client.LAYOUT_FIELDS``): metrics such as
  ``solve_ms`` and fields a service adds may legitimately differ;
* ``fetch_agreed_plan(strategy="broadcast")`` (default) lets the domain's first rank fetch and
  broadcast the plan (one request per step instead of one per rank), then still checks the
  digest; ``strategy="verify"`` has every rank fetch (relying on the idempotency key) and checks;
* ``agreed_layout`` cuts out this rank's ``LocalLayout`` and agrees on one validity flag, so a
  layout error that only some ranks see raises on all of them.

Every function takes the domain's process group (``RepackGroups.domain``; default: world) and
uses ranks *inside* it (``src`` is a group rank). The HTTP client is ``plan_client`` (no torch).
"""

from __future__ import annotations

import contextlib
import time
from typing import Literal

import torch
import torch.distributed as dist

from runtime_client.groups import collective_device
from runtime_client.local_layout import LocalLayout, PlanLayoutError
from runtime_client.plan_client import (
    FetchedPlan,
    PlanClient,
    PlanMismatchError,
    PlanServiceError,
    layout_digest,
)
from solver.schema import Plan, PlanRequest

NO_PLAN = bytes(32)
"""Digest a rank contributes when it has no plan (its fetch raised): the others fail too."""


def agree_on_plan(plan: Plan | None, group: dist.ProcessGroup | None = None) -> str:
    """All-gather every rank's layout digest; raise ``PlanMismatchError`` on all ranks if any
    differs. Returns the agreed digest (hex). Collective over ``group`` (default: world).

    A rank whose fetch failed passes None, so that the others raise instead of waiting.
    """
    device = collective_device(group)
    digest = NO_PLAN if plan is None else layout_digest(plan)
    mine_B = torch.frombuffer(bytearray(digest), dtype=torch.uint8).to(device)
    world = dist.get_world_size(group)
    gathered = [torch.empty_like(mine_B) for _ in range(world)]
    dist.all_gather(gathered, mine_B, group=group)
    # Host sync on GPU backends: 32 bytes per rank, once per step, to compare on the host.
    by_digest: dict[str, list[int]] = {}
    for r, digest_B in enumerate(gathered):
        by_digest.setdefault(digest_B.cpu().numpy().tobytes().hex(), []).append(r)
    if len(by_digest) > 1 or NO_PLAN.hex() in by_digest:
        names = {NO_PLAN.hex(): "no plan"}
        parts = "; ".join(f"{names.get(d, d[:12])}: ranks {rs}" for d, rs in by_digest.items())
        raise PlanMismatchError(f"ranks disagree on the step's plan: {parts}")
    return next(iter(by_digest))


def broadcast_plan(
    plan: Plan | None,
    src: int = 0,
    group: dist.ProcessGroup | None = None,
    *,
    error: str | None = None,
) -> Plan:
    """Send group rank ``src``'s plan to every rank of ``group`` (other ranks pass None).

    If ``src`` has no plan it passes ``error`` instead, and every rank raises
    ``PlanServiceError`` with that message rather than waiting for a plan that never comes.
    """
    is_src = dist.get_rank(group) == src
    if is_src and (plan is None) == (error is None):
        raise ValueError("the source rank passes exactly one of plan and error")
    device = collective_device(group)
    if is_src:
        payload = (error or "").encode() if plan is None else plan.model_dump_json().encode()
    else:
        payload = b""
    # Counts before data: receivers size their buffer from the length; negative = an error.
    sign = -1 if is_src and plan is None else 1
    size_1 = torch.tensor([sign * len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(size_1, group_src=src, group=group)
    size = int(size_1.item())  # host sync on GPU backends
    buffer_B = (
        torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
        if is_src
        else torch.empty(abs(size), dtype=torch.uint8, device=device)
    )
    if size:  # an empty error message needs no second broadcast
        dist.broadcast(buffer_B, group_src=src, group=group)
    text = buffer_B.cpu().numpy().tobytes()  # host copy on GPU backends
    if size < 0 or (is_src and plan is None):
        raise PlanServiceError(f"rank {src} has no plan: {text.decode()}", 0)
    if is_src and plan is not None:
        return plan
    return Plan.model_validate_json(text)


def fetch_agreed_plan(
    client: PlanClient | None,
    request: PlanRequest,
    *,
    strategy: Literal["broadcast", "verify"] = "broadcast",
    src: int = 0,
    group: dist.ProcessGroup | None = None,
) -> FetchedPlan:
    """The step's plan, identical on every rank of ``group`` (collective; raises on mismatch).

    ``broadcast``: only ``src`` needs a client; ``verify``: every rank fetches with its client.
    A rank whose fetch raises (fallback disabled, planner error) still joins the collective, so
    every rank raises instead of hanging until the group timeout.
    """
    if strategy == "verify":
        if client is None:
            raise ValueError("strategy 'verify' needs a client on every rank")
        try:
            fetched = client.get(request)
        except Exception:
            with contextlib.suppress(PlanMismatchError):  # this rank raises its own error
                agree_on_plan(None, group=group)  # makes the other ranks raise
            raise
    elif dist.get_rank(group) == src:
        if client is None:
            raise ValueError("the source rank needs a client")
        try:
            fetched = client.get(request)
        except Exception as exc:
            broadcast_plan(None, src=src, group=group, error=f"{type(exc).__name__}: {exc}")
            raise
        broadcast_plan(fetched.plan, src=src, group=group)
    else:
        t0 = time.perf_counter()
        received = broadcast_plan(None, src=src, group=group)
        fetched = FetchedPlan(received, "broadcast", 0, time.perf_counter() - t0)
    agree_on_plan(fetched.plan, group=group)
    return fetched


def agreed_layout(plan: Plan, group: dist.ProcessGroup | None = None) -> LocalLayout:
    """This rank's ``LocalLayout`` of ``plan``, or ``PlanLayoutError`` on every rank of ``group``.

    ``LocalLayout.from_plan`` already checks the whole plan, so a bad plan held by every rank
    fails everywhere without communication; this adds one 1-element all-reduce (a host sync on
    GPU backends, once per step) for errors only some ranks see, e.g. ranks holding different
    copies of the plan when the digest check was skipped. It also refuses a plan whose rank
    count differs from the domain's. Collective over ``group``; call it before the first
    exchange of the step.
    """
    error: PlanLayoutError | None = None
    layout: LocalLayout | None = None
    try:
        layout = LocalLayout.from_plan(plan, dist.get_rank(group))
        if len(plan.tokens) != dist.get_world_size(group):
            raise PlanLayoutError(
                f"the plan has {len(plan.tokens)} ranks, the domain {dist.get_world_size(group)}"
            )
    except PlanLayoutError as exc:
        error = exc
    failed_1 = torch.tensor([0 if error is None else 1], device=collective_device(group))
    dist.all_reduce(failed_1, op=dist.ReduceOp.MAX, group=group)
    if error is not None:
        raise error
    if int(failed_1.item()):
        raise PlanLayoutError("another rank of the domain refused the plan's layout")
    assert layout is not None
    return layout
