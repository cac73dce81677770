"""Seeded sample arguments for every `torch.ops.deepgemm` op, shared by the CPU and GPU op tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import deepgemm
from tests.helpers import random_activations, random_grouped_weights, random_operands

FP8 = torch.float8_e4m3fn


def fp8_aware_allclose(original: Callable[..., bool]) -> Callable[..., bool]:
    """torch.allclose has no float8 kernel, and opcheck's schema check compares inputs with it; compare float8
    tensors bit for bit instead (a test-side shim for that torch gap)."""
    def allclose(a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
        if a.dtype == FP8:
            return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        return original(a, b, *args, **kwargs)
    return allclose


def op_cases(device: str, seed: int) -> dict[str, tuple]:
    """op name -> positional arguments, odd shapes included (M=100, N=200, partial scale blocks)."""
    gen = torch.Generator().manual_seed(seed)
    a, b = random_operands(100, 200, 256, device, seed)
    groups, n, k = 3, 136, 256
    bg = random_grouped_weights(groups, n, k, device, seed + 1)
    rows = 128 * 4
    ag = random_activations(rows, k, device, seed + 2)
    m_indices = torch.tensor([0] * 128 + [2] * 100 + [-1] * 28 + [1] * 128 + [-1] * 128, dtype=torch.int32,
                             device=device)
    psum = torch.tensor([100, 356, 400], dtype=torch.int32, device=device)
    max_m = 64 * 2
    am = random_activations(groups * max_m, k, device, seed + 3)
    am = (am[0].view(groups, max_m, k), am[1].view(groups, max_m, -1))
    masked_m = torch.tensor([100, 0, 128], dtype=torch.int32, device=device)
    ks = [128, 0, 256]
    ka = random_activations(72, sum(ks), device, seed + 4)
    kb = random_activations(40, sum(ks), device, seed + 5)
    c = torch.randn((len(ks), 72, 40), generator=gen).to(device)
    x = (torch.randn(100, 200, generator=gen) * 3).to(device, torch.bfloat16)
    bf16 = torch.bfloat16
    xa = torch.randn(100, 256, generator=gen).to(device, bf16)   # A [M, K] (nt, nn)
    xt = torch.randn(256, 104, generator=gen).to(device, bf16)   # A given as [K, M] (tn, tt): M % 8 == 0
    wt = torch.randn(200, 256, generator=gen).to(device, bf16)   # B [N, K] (nt, tt)
    wn = torch.randn(256, 200, generator=gen).to(device, bf16)   # B given as [K, N] (nn, tn)
    q = torch.randn(9, 4, 24, generator=gen).to(device, bf16)      # RoPE: 9 tokens, GQA, partial rotary (16 of 24)
    k_rope = torch.randn(9, 2, 24, generator=gen).to(device, bf16)
    cache = torch.randn(50, 16, generator=gen).to(device)
    positions = torch.randint(0, 50, (9,), generator=gen).to(device)
    return {
        "fp8_gemm_nt": (*a, *b, bf16, 66),  # num_sms=66 (the calls without it: tests/cpu/test_ops.py)
        "fp8_gemm_nt_out": (*a, *b, torch.empty(100, 200, dtype=torch.float32, device=device), 66),
        "m_grouped_fp8_gemm_nt_contiguous": (*ag, *bg, m_indices, bf16),
        "m_grouped_fp8_gemm_nt_contiguous_out": (*ag, *bg, m_indices, torch.empty(rows, n, dtype=bf16, device=device)),
        "m_grouped_fp8_gemm_nt_contiguous_psum": (*ag, *bg, psum, torch.float32),
        "m_grouped_fp8_gemm_nt_contiguous_psum_out": (*ag, *bg, psum, torch.empty(rows, n, dtype=bf16, device=device)),
        "m_grouped_fp8_gemm_nt_masked": (*am, *bg, masked_m, 100, bf16),
        "m_grouped_fp8_gemm_nt_masked_out": (*am, *bg, masked_m, 100,
                                             torch.zeros(groups, max_m, n, dtype=bf16, device=device)),
        "k_grouped_fp8_gemm_tn_contiguous": (*ka, *kb, ks, c),
        "k_grouped_fp8_gemm_tn_contiguous_out": (*ka, *kb, ks, None, torch.empty_like(c)),
        "k_grouped_fp8_gemm_tn_contiguous_accumulate": (*ka, *kb, ks, c.clone()),
        "quantize_per_token_group": (x, 128),
        "silu_mul_quantize_per_token_group": (x, 128),  # [gate | up] of 100 columns each
        "quantize_per_block": (x, 128),
        "quantize_transposed": (x, 256),  # x [100, 200] -> x^T [200, 256], padded past 100 tokens
        "quantize_both_ways": (x, 128),
        "quantize_per_block_transposed": (x,),
        "bf16_gemm": (xa, wn, "nn", torch.randn(100, 200, generator=gen).to(device), bf16),
        "bf16_gemm_out": (xt, wt, "tt", None, torch.empty(104, 200, dtype=torch.float32, device=device)),
        "bf16_gemm_accumulate": (xa, wt, "nt", torch.randn(100, 200, generator=gen).to(device, bf16)),
        "softmax": (torch.randn(2, 5, 100, 7, generator=gen).to(device, bf16), 0.3, True),
        "softmax_backward": (torch.rand(100, 77, generator=gen).to(device), torch.randn(100, 77, generator=gen).to(device),
                             -0.5),
        "rope": (q, k_rope, cache, positions, True, False),
        "rope_": (q.clone(), k_rope.clone(), cache, positions, False),
    }


OP_NAMES = tuple(op_cases("cpu", 0))


def public_functions() -> list[str]:
    """Public deepgemm functions that have a custom op (the rest are plain torch code or host-only)."""
    return [name for name in deepgemm.__all__ if name in OP_NAMES]
