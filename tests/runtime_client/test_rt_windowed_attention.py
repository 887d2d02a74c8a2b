"""The toy's loop-free sliding-window attention equals the per-sample masked reference."""

from __future__ import annotations

import pytest
import torch

from runtime_client.toy_model import per_sample_attention, varlen_attention, windowed_attention


def _cu(lengths: list[int]) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


@pytest.mark.parametrize(
    ("lengths", "window", "kv_heads"),
    [
        ([5, 40, 1, 17, 100], 16, 2),  # shorter and longer than the window, a 1-token sample
        ([3], 16, 4),  # the whole shard shorter than the window
        ([30, 2], 64, 1),
        ([200, 300, 7], 16, 8),  # no GQA
        ([1, 1, 1], 1, 2),  # window 1: each token sees itself only
    ],
)
def test_windowed_matches_reference_values_and_gradients(
    lengths: list[int], window: int, kv_heads: int
) -> None:
    torch.manual_seed(0)
    total, cu = sum(lengths), _cu(lengths)
    q = torch.randn(total, 8, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(total, kv_heads, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(total, kv_heads, 4, dtype=torch.float64, requires_grad=True)
    ref = per_sample_attention(q, k, v, cu, window)
    got = windowed_attention(q, k, v, cu, window)
    assert torch.allclose(got, ref, atol=1e-12, rtol=0)
    g_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    g_got = torch.autograd.grad(got.square().sum(), (q, k, v))
    for a, b in zip(g_got, g_ref, strict=True):
        assert torch.allclose(a, b, atol=1e-11, rtol=0)


def test_varlen_routes_windows_to_the_loop_free_path_and_keeps_empty_shards_connected() -> None:
    q = torch.randn(12, 4, 2, dtype=torch.float64)
    k = v = torch.randn(12, 2, 2, dtype=torch.float64)
    cu = [0, 5, 12]
    assert torch.equal(varlen_attention(q, k, v, cu, 3), windowed_attention(q, k, v, cu, 3))
    assert torch.equal(varlen_attention(q, k, v, cu, None), per_sample_attention(q, k, v, cu, None))
    empty = torch.zeros(0, 4, 2, requires_grad=True)
    out = windowed_attention(empty, torch.zeros(0, 2, 2), torch.zeros(0, 2, 2), [0], 3)
    assert out.shape == (0, 4, 2) and out.requires_grad
