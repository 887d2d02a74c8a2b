"""``RepackDataIterator``: wrap each rank's data iterator so the loop gets repacked batches.

The shape of Megatron's ``HybridCPDataLoaderWrapper``, with the plan from the repack service:

1. every rank of the repack domain pulls its own packed batch (``LocalSamples``) from the
   user's iterable;
2. the sample lengths are all-gathered over the domain; the request carries the upstream
   membership (``parent_of``: a sample belongs to the upstream parent of the rank that pulled
   it, ``RepackLoaderConfig.parent_sizes``);
3. the plan is requested ``prefetch_depth`` steps ahead (the HTTP runs while earlier steps
   train) and agreed on by every rank (``fetch_agreed_plan``: broadcast + layout digest);
4. one all-to-all of token rows (ids, plus labels if given) moves every sample to its planned
   ranks (``reroute``);
5. it yields a ``RepackBatch``: rank-local tokens, labels, position ids and ``PackedSeqParams``
   (device int32 ``cu_seqlens``, host ``max_seqlen``) for the full and the sparse layers, and
   the step's ``RepackComm``.

All control traffic (lengths, plan, digest, token ids) runs over ``control_group``, a CPU
(gloo) group over the domain's ranks that the training collectives never use. That is what
lets ``background=True`` run steps 1-4 on a helper thread while the model trains: the critical
path of ``next()`` is then a queue hand-off and the host-to-device copies. With
``background=False`` the same steps run inline in ``next()`` (only the HTTP is overlapped).

Measured steps (optional): given a ``StepTimer`` (attached to the model's blocks) on every
rank, the iterator times each step from the moment ``next()`` returns its batch to the moment
``next()`` is called again (or the ``with`` block ends), times the batch's all-to-alls, and
max-reduces the times over the domain (``finish``: one small all-reduce per step on the domain
group, on the caller's thread). The rank given a ``MeasurementReporter`` (the domain's first)
posts them in the background; failures are logged, never raised into training. Without a
reporter there the times are not sent anywhere (said once in the log).

Checkpointing (``Stateful``): ``state_dict()`` holds the next step to yield and, when the
user's iterable is stateful itself, *its* state from just before that step's batch was pulled
(the wrapper reads ahead, so the iterable's current state would skip batches).
``load_state_dict`` before iterating resumes there: the same ``(job_id, step)`` keys are asked
for again, and the service (idempotency) or the deterministic fallback planner returns the
same layouts.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from runtime_client.agreement import agreed_layout, fetch_agreed_plan
from runtime_client.all_to_all import RepackComm
from runtime_client.batches import LocalSamples, RepackBatch, RepackLoaderConfig
from runtime_client.groups import RepackGroups
from runtime_client.measurements import MeasurementReporter
from runtime_client.packed_seq import PackedSeqParams
from runtime_client.plan_client import PlanClient
from runtime_client.reroute import gather_lengths, reroute_plan, reroute_rows
from runtime_client.step_timer import StepTimer, time_exchanges
from solver.schema import PlanRequest

__all__ = [
    "LocalSamples",
    "RepackBatch",
    "RepackDataIterator",
    "RepackLoaderConfig",
    "control_group_for",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Announced:
    step: int
    samples: LocalSamples
    per_rank: list[list[int]]
    request: PlanRequest


class _End:
    """The iterable is exhausted on some rank; every rank stops at the same step."""


class RepackDataIterator(Iterator[RepackBatch]):
    """Stateful iterator of repacked batches (see the module docstring)."""

    def __init__(
        self,
        source: Iterable[LocalSamples],
        config: RepackLoaderConfig,
        groups: RepackGroups,
        client: PlanClient | None,
        *,
        control_group: dist.ProcessGroup | None = None,
        device: torch.device | str = "cpu",
        timer: StepTimer | None = None,
        reporter: MeasurementReporter | None = None,
    ) -> None:
        """``client``: needed on ``config.src`` (broadcast) or every rank (verify), else None.
        ``control_group``: a gloo group over the domain's ranks, used by nothing else (the helper
        thread's collectives must not interleave with training's); None = ``control_group_for``
        the groups' domain, created here (collective over the world: every rank of every
        replica constructs its iterator at the same point). ``timer``: on every rank of the
        domain or on none (its ``finish`` is collective); ``reporter``: on the rank that posts
        the measurements (the domain's first), None elsewhere."""
        self.config, self.groups, self.client = config, groups, client
        if control_group is None:
            control_group = control_group_for(groups.domain)
        self.control_group = control_group
        self.device = torch.device(device)
        self._source = source
        self.rank = dist.get_rank(control_group)
        self.world = dist.get_world_size(control_group)
        if self.world != config.cluster.world_size:
            raise ValueError(
                f"Expected a domain of {config.cluster.world_size} ranks, "
                f"the control group has {self.world}."
            )
        self._next_step = 0  # the next step next() yields
        self._pull_step = 0  # the next step whose batch is pulled (set again at the start)
        self._iter: Iterator[LocalSamples] | None = None
        self._announced: deque[_Announced] = deque()
        self._source_states: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[RepackBatch | _End | BaseException] = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ended = False
        self.timer, self.reporter = timer, reporter
        self._measuring: RepackBatch | None = None  # the step being timed
        if timer is not None and reporter is None and self.rank == 0:
            logger.info("no measurement service configured: step times are not reported")

    # -- Stateful ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Resume point: the next step to yield and the iterable's state before its batch."""
        with self._lock:
            source = self._source_states.get(self._next_step)
        if source is None and self._iter is None:
            source = _source_state(self._source)
        return {"job_id": self.config.job_id, "step": self._next_step, "source": source}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state["step"]``; call before the first ``next()``."""
        if self._iter is not None:
            raise RuntimeError("load_state_dict must be called before iterating")
        if state["job_id"] != self.config.job_id:
            raise ValueError(
                f"checkpoint is for job {state['job_id']!r}, this iterator is for "
                f"{self.config.job_id!r}: the plans of a different job id would differ"
            )
        self._next_step = int(state["step"])
        if state.get("source") is not None:
            load = getattr(self._source, "load_state_dict", None)
            if load is None:
                raise ValueError("checkpoint holds an iterable state, the iterable has none")
            load(state["source"])

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> RepackDataIterator:
        return self

    def __next__(self) -> RepackBatch:
        if self._ended:
            raise StopIteration
        self._finish_measured()  # the previous step ends when the next batch is asked for
        self._start()
        # Background: a queue hand-off; inline: the step's collectives run here.
        item: RepackBatch | _End | BaseException
        if self.config.background:
            item = self._queue.get()
        else:
            try:
                item = self._prepare_next()
            except BaseException as exc:  # like the thread's: no later step after an error
                item = exc
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        if isinstance(item, _End):
            self._ended = True
            raise StopIteration
        batch = item.to(self.device)  # no-op on the CPU; async copies from pinned memory on CUDA
        with self._lock:
            self._next_step = item.step + 1
            for step in [s for s in self._source_states if s <= item.step]:
                del self._source_states[step]
        if self.timer is not None:
            time_exchanges(batch.comm, self.timer)
            self._measuring = batch
            self.timer.start()
        return batch

    def _finish_measured(self) -> None:
        """Max-reduce the open step's times over the domain (collective) and queue the post.
        Errors are logged, never raised: measuring must not stop training."""
        batch, self._measuring = self._measuring, None
        if batch is None or self.timer is None:
            return
        try:
            measured = self.timer.finish(batch.plan.plan_id, group=self.groups.domain_group)
            if self.reporter is not None:
                self.reporter.report(self.config.job_id, batch.step, measured)
        except Exception as exc:  # a lost measurement is only logged, never raised
            logger.warning("measurement of step %d not reported: %s", batch.step, exc)

    def close(self) -> None:
        """Stop the helper thread: it finishes the step it is on, which every rank also
        reaches, so no peer is left inside a collective. The client is the caller's to close."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._ended = True

    def __enter__(self) -> RepackDataIterator:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:  # every rank leaves the loop here: the last step's collective
            self._finish_measured()
        self.close()

    def _start(self) -> None:
        if self._iter is not None:
            return
        self._iter = iter(self._source)
        self._pull_step = self._next_step
        if self.config.background:
            self._thread = threading.Thread(target=self._run, name="repack-data", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        """Helper thread: prepare steps in order, one ahead of the consumer.

        It only stops while waiting to hand a step over (queue full), never between steps:
        with the same number of steps consumed, every rank's thread has then run the same
        collectives, so stopping leaves no peer waiting.
        """
        while True:
            try:
                item: RepackBatch | _End | BaseException = self._prepare_next()
            except BaseException as exc:  # handed to the consumer, raised from next()
                item = exc
            while True:
                try:
                    self._queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    if self._stop.is_set():
                        return
            if not isinstance(item, RepackBatch):
                return

    def _prepare_next(self) -> RepackBatch | _End:
        """Announce up to ``prefetch_depth`` steps ahead, then resolve the oldest one."""
        while len(self._announced) <= self.config.prefetch_depth:
            announced = self._announce(self._pull_step)
            if announced is None:
                break
            self._announced.append(announced)
            self._pull_step += 1
        if not self._announced:
            return _End()
        return self._resolve(self._announced.popleft())

    def _announce(self, step: int) -> _Announced | None:
        """Pull this rank's batch, all-gather lengths, start the plan request (collective)."""
        assert self._iter is not None
        state = _source_state(self._source)
        samples = next(self._iter, None)
        per_rank = gather_lengths(
            None if samples is None else list(samples.lengths), self.control_group
        )
        if per_rank is None or samples is None:
            return None
        with self._lock:
            self._source_states[step] = state
        request = self.config.request(step, per_rank)
        if self.client is not None:
            self.client.prefetch(request)  # HTTP in the client's pool while earlier steps train
        return _Announced(step, samples, per_rank, request)

    def _resolve(self, announced: _Announced) -> RepackBatch:
        """Agree on the plan, then move the tokens to their planned ranks (collective); the
        whole batch is built here, on the host, off the critical path."""
        fetched = fetch_agreed_plan(
            self.client,
            announced.request,
            strategy=self.config.strategy,
            src=self.config.src,
            group=self.control_group,
        )
        plan = fetched.plan
        layout = agreed_layout(plan, group=self.control_group)  # refused by all, or by none
        samples = announced.samples
        rows_TC = samples.tokens_T.unsqueeze(1)
        if samples.labels_T is not None:
            rows_TC = torch.stack([samples.tokens_T, samples.labels_T], dim=1)
        route = reroute_plan(plan, self.rank, [sum(n) for n in announced.per_rank])
        rows_NC = reroute_rows(rows_TC, route, self.control_group)
        positions_N = layout.position_ids_N
        if self.device.type == "cuda":  # page-locked: the copies in next() can be async
            rows_NC, positions_N = rows_NC.pin_memory(), positions_N.pin_memory()
        comm = RepackComm(layout, self.groups)
        return RepackBatch(
            step=announced.step,
            tokens_N=rows_NC[:, 0],
            labels_N=rows_NC[:, 1] if rows_NC.shape[1] > 1 else None,
            position_ids_N=positions_N,
            full=PackedSeqParams.from_cu_seqlens(
                layout.cu_seqlens_full,
                group=comm.parent_group,
                group_size=layout.parent_ranks[1] - layout.parent_ranks[0],
                pin=self.device.type == "cuda",
            ),
            sparse=PackedSeqParams.from_cu_seqlens(
                layout.cu_seqlens_sparse,
                group=comm.child_group,
                group_size=layout.child_ranks[1] - layout.child_ranks[0],
                pin=self.device.type == "cuda",
            ),
            comm=comm,
            plan=plan,
            source=fetched.source,
            fetch_seconds=fetched.seconds,
            total_tokens=layout.total_tokens,
        )


def control_group_for(domain: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """A new gloo group over the ranks of ``domain`` (None = the world) for the iterator's
    host-side traffic, whatever the training backend is (NCCL moves only device tensors).

    Collective over the world: the domains of all replicas are all-gathered and created in one
    sorted order (``new_subgroups_by_enumeration``), so every rank makes the same calls.
    """
    if domain is None or domain == dist.group.WORLD:
        return dist.new_group(backend="gloo")
    everyone: list[list[int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, dist.get_process_group_ranks(domain))
    domains = sorted({tuple(ranks) for ranks in everyone if ranks is not None})
    group, _ = dist.new_subgroups_by_enumeration([list(d) for d in domains], backend="gloo")
    assert group is not None  # this rank is in its own domain
    return group


def _source_state(source: object) -> Any:
    """A copy of the iterable's checkpoint state, or None if it keeps none."""
    state_dict = getattr(source, "state_dict", None)
    return copy.deepcopy(state_dict()) if callable(state_dict) else None
