"""Varlen attention over a packed sequence, for the full and the sliding-window layers.

Two kernels behind one function, both driven by ``PackedSeqParams`` (device int32
``cu_seqlens``, host ``max_seqlen``), so a step never reads boundaries back from the device:

* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` over the whole packed
  sequence with a block-diagonal boolean mask built on the device from ``cu_seqlens`` (token t
  may see token s iff both are in the same sample, ``s <= t``, and, for a window ``w``,
  ``t - s < w``). Works on any device and dtype, GQA through ``enable_gqa``; the mask is
  ``T x T`` booleans, so it is meant for CPU tests, small shards and as a reference, not for
  100k-token parents (use flash-attn there).
* ``flash``: ``flash_attn.flash_attn_varlen_func`` (when flash-attn is importable and the tensors
  are on CUDA in fp16/bf16): no mask at all, sliding window as ``window_size=(w - 1, 0)``.

``impl="auto"`` picks ``flash`` when it can run, else ``sdpa``.

``repacked_full_attention`` / ``repacked_sparse_attention`` are the two layer adapters a model
calls with its local-layout Q/K/V (``[n_local, heads, head_dim]``): the fused exchange to the
parent (or the child's Ulysses exchange), varlen attention over ``heads/P`` heads, and back.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Literal

import torch
import torch.nn.functional as F

from runtime_client.all_to_all import RepackComm
from runtime_client.packed_seq import PackedSeqParams

Impl = Literal["auto", "sdpa", "flash"]

FLASH_DTYPES = (torch.float16, torch.bfloat16)
"""Dtypes flash-attn's varlen kernel accepts."""


def flash_attn_available() -> bool:
    """True when ``flash_attn`` can be imported (it is not a dependency of this package)."""
    return importlib.util.find_spec("flash_attn") is not None


def _use_flash(q_THD: torch.Tensor, impl: Impl) -> bool:
    runnable = q_THD.is_cuda and q_THD.dtype in FLASH_DTYPES and flash_attn_available()
    if impl == "flash" and not runnable:
        raise RuntimeError(
            "impl='flash' needs flash-attn installed and CUDA fp16/bf16 tensors, got "
            f"{q_THD.device} {q_THD.dtype} (flash-attn importable: {flash_attn_available()})"
        )
    return impl == "flash" or (impl == "auto" and runnable)


def block_diagonal_mask(
    params: PackedSeqParams, window: int | None, device: torch.device
) -> torch.Tensor:
    """Boolean ``[T, T]`` mask (True = may attend): same sample, causal, optional window.

    Built from the device ``cu_seqlens`` with ``searchsorted`` (no host sync).
    """
    total = params.total_tokens
    t_T = torch.arange(total, device=device)
    cu = params.cu_seqlens_q.to(device=device, dtype=torch.int64)
    sample_T = torch.searchsorted(cu, t_T, right=True)  # sample index + 1 of each token
    same_TT = sample_T.unsqueeze(1) == sample_T.unsqueeze(0)
    causal_TT = t_T.unsqueeze(1) >= t_T.unsqueeze(0)
    mask_TT = same_TT & causal_TT
    if window is not None:
        mask_TT &= (t_T.unsqueeze(1) - t_T.unsqueeze(0)) < window
    return mask_TT


def sdpa_varlen_attention(
    q_THD: torch.Tensor,
    k_TKD: torch.Tensor,
    v_TKD: torch.Tensor,
    params: PackedSeqParams,
    window: int | None = None,
) -> torch.Tensor:
    """Causal (optionally windowed) attention inside each sample through SDPA; ``[T, H, D]``."""
    if q_THD.shape[0] != params.total_tokens:
        raise ValueError(f"Expected {params.total_tokens} tokens, got {q_THD.shape[0]}.")
    if q_THD.shape[0] == 0:  # nothing here: keep the graph connected for backward collectives
        return q_THD * 0.0
    mask_TT = block_diagonal_mask(params, window, q_THD.device)
    o_HTD = F.scaled_dot_product_attention(
        q_THD.transpose(0, 1),
        k_TKD.transpose(0, 1),
        v_TKD.transpose(0, 1),
        attn_mask=mask_TT,
        scale=1.0 / math.sqrt(q_THD.shape[-1]),
        enable_gqa=k_TKD.shape[1] != q_THD.shape[1],
    )
    return o_HTD.transpose(0, 1)


def flash_varlen_attention(
    q_THD: torch.Tensor,
    k_TKD: torch.Tensor,
    v_TKD: torch.Tensor,
    params: PackedSeqParams,
    window: int | None = None,
) -> torch.Tensor:
    """The same through ``flash_attn_varlen_func`` (GQA native, window ``(w - 1, 0)``)."""
    from flash_attn import flash_attn_varlen_func  # optional dependency, imported on use

    if q_THD.shape[0] == 0:
        return q_THD * 0.0
    out: torch.Tensor = flash_attn_varlen_func(
        q_THD,
        k_TKD,
        v_TKD,
        params.cu_seqlens_q,
        params.cu_seqlens_kv,
        params.max_seqlen_q,
        params.max_seqlen_kv,
        causal=True,
        window_size=(-1, -1) if window is None else (window - 1, 0),
    )
    return out


def varlen_attention(
    q_THD: torch.Tensor,
    k_TKD: torch.Tensor,
    v_TKD: torch.Tensor,
    params: PackedSeqParams,
    window: int | None = None,
    *,
    impl: Impl = "auto",
) -> torch.Tensor:
    """Causal attention within each sample of a packed sequence (see the module docstring)."""
    if _use_flash(q_THD, impl):
        return flash_varlen_attention(q_THD, k_TKD, v_TKD, params, window)
    return sdpa_varlen_attention(q_THD, k_TKD, v_TKD, params, window)


def repacked_full_attention(
    q_NHD: torch.Tensor,
    k_NKD: torch.Tensor,
    v_NKD: torch.Tensor,
    comm: RepackComm,
    params: PackedSeqParams,
    *,
    impl: Impl = "auto",
) -> torch.Tensor:
    """Full-attention layer: child layout -> parent (fused all-to-all) -> attention -> back.

    ``params`` describes the parent packed sequence (``RepackBatch.full``).
    """
    q_THD, k_TKD, v_TKD = comm.to_full(q_NHD, k_NKD, v_NKD)
    return comm.to_child(varlen_attention(q_THD, k_TKD, v_TKD, params, None, impl=impl))


def repacked_sparse_attention(
    q_NHD: torch.Tensor,
    k_NKD: torch.Tensor,
    v_NKD: torch.Tensor,
    comm: RepackComm,
    params: PackedSeqParams,
    window: int,
    *,
    impl: Impl = "auto",
) -> torch.Tensor:
    """Sliding-window layer: Ulysses over the child group, windowed attention, back.

    ``params`` describes the child packed sequence (``RepackBatch.sparse``).
    """
    q_THD, k_TKD, v_TKD = comm.child_to_heads(q_NHD, k_NKD, v_NKD)
    return comm.child_to_sequence(varlen_attention(q_THD, k_TKD, v_TKD, params, window, impl=impl))
