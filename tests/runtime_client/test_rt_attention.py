"""Varlen attention adapters against the per-sample loop reference, and the packed-sequence
parameter object's contract (device int32 boundaries, host max_seqlen, Megatron field names)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runtime_client.attention import (
    block_diagonal_mask,
    flash_attn_available,
    sdpa_varlen_attention,
    varlen_attention,
)
from runtime_client.packed_seq import PackedSeqParams
from runtime_client.toy_model import varlen_attention as loop_reference

CASES = [
    ([0, 5, 6, 30, 31, 50], None),  # full causal, incl. one-token samples
    ([0, 5, 6, 30, 31, 50], 4),  # sliding window shorter than most samples
    ([0, 17], 16),  # window one shorter than the sample
    ([0, 3, 40], 100),  # window wider than every sample = full
]

MEGATRON_FIELDS = {
    "qkv_format",
    "cu_seqlens_q",
    "cu_seqlens_kv",
    "cu_seqlens_q_padded",
    "cu_seqlens_kv_padded",
    "max_seqlen_q",
    "max_seqlen_kv",
    "local_cp_size",
    "cp_group",
}
"""megatron.core.packed_seq_params.PackedSeqParams' constructor fields (Megatron-Core 0.14+)."""


def _qkv(total: int, heads: int, kv_heads: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(total, heads, 8), (total, kv_heads, 8), (total, kv_heads, 8)]
    return [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]


@pytest.mark.parametrize(("cu", "window"), CASES)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 1), (8, 2)])
def test_sdpa_matches_the_per_sample_loop(
    cu: list[int], window: int | None, heads: int, kv_heads: int
) -> None:
    q, k, v = _qkv(cu[-1], heads, kv_heads)
    params = PackedSeqParams.from_cu_seqlens(cu)
    got = sdpa_varlen_attention(q, k, v, params, window)
    grads_got = torch.autograd.grad(got.square().sum(), (q, k, v))
    want = loop_reference(q, k, v, cu, window)
    grads_want = torch.autograd.grad(want.square().sum(), (q, k, v))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for g, w in zip(grads_got, grads_want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_off_by_one_window_is_detected() -> None:
    """Negative control: the comparison above can fail (a window of w vs w + 1 differs)."""
    cu = [0, 30]
    q, k, v = _qkv(30, 4, 2)
    params = PackedSeqParams.from_cu_seqlens(cu)
    diff = sdpa_varlen_attention(q, k, v, params, 5) - loop_reference(q, k, v, cu, 6)
    assert diff.abs().max() > 1e-3


def test_mask_is_block_diagonal_causal_and_windowed() -> None:
    params = PackedSeqParams.from_cu_seqlens([0, 3, 7])
    mask = block_diagonal_mask(params, 2, torch.device("cpu"))
    assert mask.shape == (7, 7)
    assert mask[2, 2] and mask[2, 1] and not mask[2, 0]  # window of 2 includes itself
    assert not mask[3, 2]  # sample boundary
    assert not mask[4, 5]  # causal
    assert mask.sum() == (1 + 2 + 2) + (1 + 2 + 2 + 2)  # per row, per sample


def test_empty_shard_stays_connected_to_the_graph() -> None:
    q, k, v = _qkv(0, 4, 2)
    out = varlen_attention(q, k, v, PackedSeqParams.from_cu_seqlens([0]))
    assert out.shape == (0, 4, 8) and out.requires_grad


def test_packed_seq_params_are_int32_with_host_max() -> None:
    params = PackedSeqParams.from_cu_seqlens((0, 5, 6, 30))
    assert params.cu_seqlens_q.dtype == torch.int32
    assert params.cu_seqlens_q.tolist() == [0, 5, 6, 30]
    assert params.cu_seqlens_kv is params.cu_seqlens_q
    assert (params.max_seqlen_q, params.max_seqlen_kv, params.total_tokens) == (24, 24, 30)
    assert isinstance(params.max_seqlen_q, int)
    assert set(params.megatron_kwargs()) == MEGATRON_FIELDS
    assert {f.name for f in dataclasses.fields(PackedSeqParams)} >= MEGATRON_FIELDS


def test_bad_boundaries_are_refused() -> None:
    with pytest.raises(ValueError, match="start at 0 and not decrease"):
        PackedSeqParams.from_cu_seqlens([0, 5, 3])
    with pytest.raises(ValueError, match="int32"):
        cu = torch.tensor([0, 4])
        PackedSeqParams(
            cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=4, max_seqlen_kv=4, total_tokens=4
        )


def test_flash_requested_without_flash_is_an_error() -> None:
    if flash_attn_available() and torch.cuda.is_available():
        pytest.skip("flash-attn can run here; the GPU test below covers it")
    q, k, v = _qkv(6, 4, 2)
    with pytest.raises(RuntimeError, match="flash-attn"):
        varlen_attention(q, k, v, PackedSeqParams.from_cu_seqlens([0, 6]), impl="flash")


@pytest.mark.skipif(
    not (flash_attn_available() and torch.cuda.is_available()), reason="needs flash-attn + CUDA"
)
@pytest.mark.parametrize("window", [None, 4])
def test_flash_matches_sdpa_on_gpu(window: int | None) -> None:
    cu = [0, 5, 6, 30, 31, 50]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(50, h, 64, generator=gen) for h in (8, 2, 2))
    q, k, v = (t.to("cuda", torch.bfloat16) for t in (q, k, v))
    params = PackedSeqParams.from_cu_seqlens(cu, "cuda")
    flash = varlen_attention(q, k, v, params, window, impl="flash")
    sdpa = varlen_attention(q, k, v, params, window, impl="sdpa")
    torch.testing.assert_close(flash.float(), sdpa.float(), rtol=2e-2, atol=2e-2)
