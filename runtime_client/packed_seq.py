"""Packed-sequence parameters for varlen attention kernels, in Megatron's vocabulary.

A varlen kernel (flash-attn's ``flash_attn_varlen_func``, Transformer Engine's ``thd`` format,
this package's SDPA adapter) needs, every step, the sample boundaries of the packed sequence as
an int32 tensor *on the device* plus the longest sample as a host int (it sizes the kernel's
grid; reading it from a device tensor would cost a device-to-host sync per layer).

``PackedSeqParams`` carries exactly that, with the field names of Megatron-Core's
``megatron.core.packed_seq_params.PackedSeqParams`` so a Megatron/TE attention layer can take it
field for field:

=====================  ==========================================================================
field                  meaning here (Megatron's meaning is the same unless noted)
=====================  ==========================================================================
``qkv_format``         always ``"thd"``: tokens x heads x head_dim, samples concatenated
``cu_seqlens_q``       int32 ``[samples + 1]`` boundaries of the queries' packed sequence
``cu_seqlens_kv``      the same tensor (self-attention: keys are the same tokens)
``cu_seqlens_q_padded`` None: repack never pads samples (Megatron uses it for CP padding to 2*cp)
``cu_seqlens_kv_padded`` None, as above
``max_seqlen_q``       longest sample, host int (Megatron: int in recent versions)
``max_seqlen_kv``      equal to ``max_seqlen_q``
``total_tokens``       tokens in the packed sequence, host int
``local_cp_size``      ranks of the group the sequence lives on after the exchange (parent for
                       full layers, child for sparse); Megatron's hybrid-CP field of that name
``cp_group``           that group; None for a single rank (Megatron: the CP group of the sample)
=====================  ==========================================================================

Unlike Megatron's mutable dataclass this one is frozen: one instance per step and layer kind,
built once by the data iterator and shared by every layer of that kind.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(kw_only=True, frozen=True)
class PackedSeqParams:
    """Sample boundaries of one packed sequence, ready for a varlen kernel (see module doc)."""

    qkv_format: str = "thd"
    """Layout of Q/K/V: ``thd`` = [tokens, heads, head_dim], samples concatenated."""

    cu_seqlens_q: torch.Tensor
    """int32 ``[samples + 1]`` cumulative sample lengths of the queries, on the device."""

    cu_seqlens_kv: torch.Tensor
    """int32 cumulative lengths of the keys/values (the same tensor for self-attention)."""

    cu_seqlens_q_padded: torch.Tensor | None = None
    """Padded boundaries (Megatron's CP padding); repack never pads, so always None."""

    cu_seqlens_kv_padded: torch.Tensor | None = None
    """Padded key boundaries; always None (see ``cu_seqlens_q_padded``)."""

    max_seqlen_q: int
    """Longest query sample, a host int (no device sync when a kernel sizes its grid)."""

    max_seqlen_kv: int
    """Longest key sample."""

    total_tokens: int
    """Tokens in the packed sequence, a host int (Megatron's newest versions have it too)."""

    local_cp_size: int = 1
    """Ranks of the group holding this sequence after the exchange (parent or child size)."""

    cp_group: dist.ProcessGroup | None = None
    """That group's communicator; None for a single rank."""

    def __post_init__(self) -> None:
        if self.qkv_format != "thd":
            raise ValueError(f"Expected qkv_format 'thd', got {self.qkv_format!r}.")
        for name in ("cu_seqlens_q", "cu_seqlens_kv"):
            cu = getattr(self, name)
            if cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 1:
                raise ValueError(f"Expected {name} a 1-D int32 tensor, got {cu.dtype} {cu.shape}.")

    @classmethod
    def from_cu_seqlens(
        cls,
        cu_seqlens: Sequence[int],
        device: torch.device | str = "cpu",
        *,
        group: dist.ProcessGroup | None = None,
        group_size: int = 1,
        pin: bool = False,
    ) -> PackedSeqParams:
        """Self-attention params from host boundaries ``[0, l0, l0 + l1, ...]``.

        One host-to-device copy (non-blocking from pinned memory on CUDA; ``pin`` page-locks a
        host result for a later ``to(device)``); ``max_seqlen`` is computed on the host, so
        nothing ever reads the device tensor back.
        """
        lengths = [b - a for a, b in itertools.pairwise(cu_seqlens)]
        if any(n < 0 for n in lengths) or (cu_seqlens and cu_seqlens[0] != 0):
            raise ValueError(f"Expected cu_seqlens to start at 0 and not decrease: {cu_seqlens}.")
        host = torch.tensor(list(cu_seqlens) or [0], dtype=torch.int32)
        target = torch.device(device)
        if target.type == "cuda" or pin:
            host = host.pin_memory()
        cu = host.to(target, non_blocking=True)
        longest = max(lengths, default=0)
        return cls(
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            max_seqlen_q=longest,
            max_seqlen_kv=longest,
            total_tokens=int(cu_seqlens[-1]) if cu_seqlens else 0,
            local_cp_size=group_size,
            cp_group=group,
        )

    def to(self, device: torch.device) -> PackedSeqParams:
        """The same boundaries on ``device`` (one non-blocking copy; self if already there)."""
        if self.cu_seqlens_q.device == device:
            return self
        cu = self.cu_seqlens_q.to(device, non_blocking=True)
        return dataclasses.replace(self, cu_seqlens_q=cu, cu_seqlens_kv=cu)

    def megatron_kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments for ``megatron.core.packed_seq_params.PackedSeqParams``
        (``local_cp_size``/``cp_group`` only exist in recent Megatron-Core; drop them for older)."""
        return {
            "qkv_format": self.qkv_format,
            "cu_seqlens_q": self.cu_seqlens_q,
            "cu_seqlens_kv": self.cu_seqlens_kv,
            "cu_seqlens_q_padded": self.cu_seqlens_q_padded,
            "cu_seqlens_kv_padded": self.cu_seqlens_kv_padded,
            "max_seqlen_q": self.max_seqlen_q,
            "max_seqlen_kv": self.max_seqlen_kv,
            "local_cp_size": self.local_cp_size,
            "cp_group": self.cp_group,
        }
