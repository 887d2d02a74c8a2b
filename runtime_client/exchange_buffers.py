"""Send buffers reused across exchanges, and the handle of an exchange still in flight.

The fused exchange (``all_to_all.FusedSequenceToHeads``) writes its packed Q/K/V into one of
these buffers instead of allocating a fresh send tensor per layer and step; an async exchange
holds its buffer until the layer waits on its ``PendingExchange``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

BufferKey = tuple[tuple[int, ...], torch.dtype, torch.device]


@dataclass
class ExchangeBuffers:
    """Send buffers reused across layers and steps, one per row shape, dtype and device.

    Rows (tokens x group ranks) change every step, so a buffer is kept per *row* shape and
    grown by ``GROWTH`` when a step needs more rows; ``acquire`` returns a view of its first
    rows. A buffer leased to an exchange still in flight (async) is not handed out again: the
    second caller gets a fresh tensor instead.
    """

    GROWTH = 1.25
    """Over-allocation when a buffer grows, so slowly rising token counts do not regrow it."""

    _free: dict[BufferKey, torch.Tensor] = field(default_factory=dict, repr=False)
    _leased: set[BufferKey] = field(default_factory=set, repr=False)
    allocations: int = 0
    """Buffers allocated (first use, growth, or a lease conflict); the rest were reused."""

    def acquire(
        self, rows: int, row_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, BufferKey | None]:
        """A ``[rows, *row_shape]`` buffer and its lease key (None: a one-off tensor)."""
        key = (row_shape, dtype, device)
        if key in self._leased:
            self.allocations += 1
            return torch.empty((rows, *row_shape), dtype=dtype, device=device), None
        buf = self._free.get(key)
        if buf is None or buf.shape[0] < rows:
            self.allocations += 1
            capacity = max(rows, int(rows * self.GROWTH)) if buf is not None else rows
            buf = torch.empty((capacity, *row_shape), dtype=dtype, device=device)
            self._free[key] = buf
        self._leased.add(key)
        return buf[:rows], key

    def release(self, key: BufferKey | None) -> None:
        """The exchange that used ``key``'s buffer has completed; it may be reused."""
        if key is not None:
            self._leased.discard(key)


@dataclass
class PendingExchange:
    """An exchange started with ``async_op=True``; ``wait()`` before using its result."""

    outputs: tuple[torch.Tensor, ...]
    work: Any = None
    """The collective's ``Work`` handle (None: nothing was in flight)."""

    release: Any = None
    """Called once the exchange completed (returns the send buffer to its pool)."""

    def wait(self) -> tuple[torch.Tensor, ...]:
        """Block (CPU) or order the current stream (GPU) after the exchange; the outputs."""
        if self.work is not None:
            self.work.wait()
            self.work = None
        if self.release is not None:
            self.release()
            self.release = None
        return self.outputs
