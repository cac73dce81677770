"""deepgemm.api.linear.fp8_linear (quantize + FP8 GEMM, the eager path of Fp8Linear) on CPU: the same numbers and
errors as the two public calls, and a temporary-block layout that is exactly quantize_per_token_group's."""

from __future__ import annotations

import re

import pytest
import torch

import deepgemm
from deepgemm.api import linear as linear_api
from tests.helpers import outcome


def _two_calls(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(x), (w, s), out_dtype=out_dtype)


@pytest.mark.parametrize("m,n,k,dtype,out_dtype", [(1, 256, 128, torch.bfloat16, torch.bfloat16),
                                                    (37, 100, 272, torch.float32, torch.float32),
                                                    (130, 384, 512, torch.float16, torch.bfloat16)])
def test_same_result_as_quantize_then_gemm(m: int, n: int, k: int, dtype: torch.dtype, out_dtype: torch.dtype,
                                           seed: int) -> None:
    x = (torch.randn(m, k) * torch.exp(torch.randn(m, 1))).to(dtype)
    w, s = deepgemm.quantize_per_block(torch.randn(n, k))
    for _ in range(2):  # (the CPU path keeps nothing between calls: each is checked)
        y = linear_api.fp8_linear(x, w, s, out_dtype)
        assert y.shape == (m, n) and y.dtype == out_dtype
        assert torch.equal(y, _two_calls(x, w, s, out_dtype))
    ref = deepgemm.dequantize_per_token_group(*deepgemm.quantize_per_token_group(x), dtype=torch.float64) @ \
        deepgemm.dequantize_per_block(w, s, dtype=torch.float64).t()
    assert deepgemm.calc_diff(y.double(), ref) < 1e-5
    assert not linear_api._ready  # the reference path is never remembered
    assert torch.equal(linear_api.fp8_linear(x, w, s, None), _two_calls(x, w, s, torch.bfloat16))  # None: bf16


def test_errors_are_the_public_calls_errors(seed: int) -> None:
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    w, s = deepgemm.quantize_per_block(torch.randn(128, 256))
    bad = {
        "x 3-D": (x.view(2, 2, 256), w, s, torch.bfloat16, None),
        "x int": (x.to(torch.int32), w, s, torch.bfloat16, None),
        "w bf16": (x, w.to(torch.bfloat16), s, torch.bfloat16, None),
        "w 1-D": (x, w.view(-1), s, torch.bfloat16, None),
        "w not a tensor": (x, "w", s, torch.bfloat16, None),
        "K mismatch": (x, w[:, :128], s[:, :1], torch.bfloat16, None),
        "scales shape": (x, w, s[:, :1], torch.bfloat16, None),
        "out_dtype": (x, w, s, torch.float16, None),
        "num_sms bool": (x, w, s, torch.bfloat16, True),
        "num_sms 0": (x, w, s, torch.bfloat16, 0),
    }
    for name, (xx, ww, ss, dt, sms) in bad.items():
        got = outcome(lambda: linear_api.fp8_linear(xx, ww, ss, dt, sms))
        want = outcome(lambda: deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(xx), (ww, ss), out_dtype=dt,
                                                    num_sms=sms))
        assert got is not None and got == want, (name, got, want)
    grad_x = x.float().requires_grad_()
    with pytest.raises(deepgemm.NotDifferentiableError, match=re.escape("'x'")):
        linear_api.fp8_linear(grad_x, w, s)


@pytest.mark.parametrize("m,k", [(1, 128), (3, 144), (61, 7168), (4096, 256), (4097, 7296)])
def test_temporary_block_matches_the_quantizer_layout(m: int, k: int) -> None:
    sf_offset, total = linear_api.temp_layout(m, k)
    assert sf_offset % 16 == 0 and sf_offset >= m * k
    temp = torch.empty(total, dtype=torch.uint8)
    q, sf = linear_api.temp_views(temp, m, k, sf_offset)
    ref_q, ref_sf = deepgemm.quantize_per_token_group(torch.randn(m, k))
    assert (q.shape, q.stride(), q.dtype) == (ref_q.shape, ref_q.stride(), ref_q.dtype)
    assert (sf.shape, sf.stride(), sf.dtype) == (ref_sf.shape, ref_sf.stride(), ref_sf.dtype)
    base = temp.data_ptr()
    assert q.data_ptr() == base and sf.data_ptr() == base + sf_offset
    # The scales' storage (every column, padded rows included) ends exactly at the block's end.
    last = sf.data_ptr() + ((sf.shape[1] - 1) * sf.stride(1) + linear_api.align_up(m, 4)) * 4
    assert last == base + total
