"""Measure one training step the way the cost model splits it: per layer kind, all-to-all, total.

* Layer times: module hooks on each hybrid block record forward (pre-hook -> hook) and backward
  (backward pre-hook -> backward hook) wall time, summed per kind (``F`` / ``S``).
* All-to-all time: ``TimedAttention`` wraps the repacked attention backend and times the forward
  exchanges; backward runs the same exchanges with the same bytes transposed, so the step's
  all-to-all time is reported as twice the forward time (an estimate, said so in the docs).
* Step time: caller's wall clock from ``start()`` to ``finish()``.

``finish`` max-reduces the four numbers over the ranks (one ``all_reduce``: a step ends when its
slowest rank does) and returns a ``StepMeasurement``. On GPUs, wall clock without a sync times
the kernel launches, not the kernels: pass ``sync=True`` (one ``cuda.synchronize`` per hook).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from runtime_client.all_to_all import RepackComm
from runtime_client.groups import collective_device
from runtime_client.toy_model import RepackAttention, varlen_attention
from solver.measurement_schema import LayerTimes, StepMeasurement

BACKWARD_EXCHANGES_PER_FORWARD = 1.0
"""Backward repeats every forward exchange once, transposed (same bytes)."""


class StepTimer:
    """Accumulates one step's times; ``attach`` it to the model's blocks once."""

    def __init__(self, *, sync: bool = False) -> None:
        self.sync = sync
        self.layer_s = {"F": 0.0, "S": 0.0}
        self.a2a_forward_s = 0.0
        self._open: dict[int, float] = {}
        self._t0 = 0.0
        self._handles: list[RemovableHandle] = []

    def now(self) -> float:
        if self.sync and torch.cuda.is_available():
            torch.cuda.synchronize()  # host-device sync: only when timing GPUs
        return time.perf_counter()

    def attach(self, blocks: Iterable[nn.Module], kinds: Iterable[str]) -> StepTimer:
        for block, kind in zip(blocks, kinds, strict=True):
            self._hook(block, kind)
        return self

    def _hook(self, block: nn.Module, kind: str) -> None:
        key_f, key_b = id(block) * 2, id(block) * 2 + 1

        def start(key: int) -> Any:
            def hook(*_: Any) -> None:
                self._open[key] = self.now()

            return hook

        def stop(key: int) -> Any:
            def hook(*_: Any) -> None:
                began = self._open.pop(key, None)
                if began is not None:
                    self.layer_s[kind] += self.now() - began

            return hook

        self._handles += [
            block.register_forward_pre_hook(start(key_f)),
            block.register_forward_hook(stop(key_f)),
            block.register_full_backward_pre_hook(start(key_b)),
            block.register_full_backward_hook(stop(key_b)),
        ]

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def start(self) -> None:
        self.layer_s = {"F": 0.0, "S": 0.0}
        self.a2a_forward_s = 0.0
        self._open.clear()
        self._t0 = self.now()

    def finish(
        self, plan_id: str | None = None, *, group: dist.ProcessGroup | None = None
    ) -> StepMeasurement:
        """The step's measurement, max-reduced over ``group``'s ranks (None = the world;
        collective: every rank of the group calls)."""
        step_s = self.now() - self._t0
        a2a_s = self.a2a_forward_s * (1.0 + BACKWARD_EXCHANGES_PER_FORWARD)
        values = torch.tensor([step_s, self.layer_s["F"], self.layer_s["S"], a2a_s])
        ranks = 1
        if dist.is_initialized():
            values = values.to(collective_device(group))
            dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
            ranks = dist.get_world_size(group)
        step, full, sparse, a2a = (float(v) * 1e3 for v in values)
        return StepMeasurement(
            step_time_ms=max(step, 1e-6),
            layers=LayerTimes(full_ms=full, sparse_ms=sparse),
            all_to_all_ms=a2a,
            plan_id=plan_id,
            ranks=ranks,
        )


EXCHANGES = ("to_full", "to_child", "child_to_heads", "child_to_sequence")


def time_exchanges(comm: RepackComm, timer: StepTimer) -> RepackComm:
    """Time ``comm``'s four forward exchanges into ``timer`` (in place, returns ``comm``), for
    attention backends that take a ``RepackComm`` (``VarlenRepackAttention``); the comm is the
    step's own, made by the data iterator, so nothing else sees the wrapping."""
    for name in EXCHANGES:
        setattr(comm, name, _timed_call(getattr(comm, name), timer))
    return comm


def _timed_call(fn: Any, timer: StepTimer) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = timer.now()
        out = fn(*args, **kwargs)
        timer.a2a_forward_s += timer.now() - t0
        return out

    return timed


class TimedAttention:
    """``RepackAttention`` with its forward exchanges timed into a ``StepTimer``."""

    def __init__(self, inner: RepackAttention, timer: StepTimer) -> None:
        self.comm = inner.comm
        self.timer = timer

    def _timed(self, fn: Any, *args: torch.Tensor) -> Any:
        t0 = self.timer.now()
        out = fn(*args)
        self.timer.a2a_forward_s += self.timer.now() - t0
        return out

    def full(self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor) -> torch.Tensor:
        q_THD, k_TKD, v_TKD = self._timed(self.comm.to_full, q_NHD, k_NKD, v_NKD)
        o_THD = varlen_attention(q_THD, k_TKD, v_TKD, self.comm.layout.cu_seqlens_full, None)
        out: torch.Tensor = self._timed(self.comm.to_child, o_THD)
        return out

    def sparse(
        self, q_NHD: torch.Tensor, k_NKD: torch.Tensor, v_NKD: torch.Tensor, window: int
    ) -> torch.Tensor:
        q_THD, k_TKD, v_TKD = self._timed(self.comm.child_to_heads, q_NHD, k_NKD, v_NKD)
        cu = self.comm.layout.cu_seqlens_sparse
        o_THD = varlen_attention(q_THD, k_TKD, v_TKD, cu, window)
        out: torch.Tensor = self._timed(self.comm.child_to_sequence, o_THD)
        return out
