"""GPU quantization kernels: bit-identical to the CPU reference, layouts the GEMM reads, no NaN on zeros."""

from __future__ import annotations

import pytest
import torch

import deepgemm
from deepgemm.reference import quantize_per_block_reference, quantize_per_token_group_reference

pytestmark = pytest.mark.gpu

SHAPES = [(1, 128), (7, 144), (65, 7168), (129, 7296), (1000, 16), (4097, 2048)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("m,k", SHAPES)
def test_per_token_group_matches_reference(m: int, k: int, dtype: torch.dtype) -> None:
    x = (torch.randn(m, k) * torch.exp(torch.randn(m, 1) * 2)).to(dtype)
    q, sf = deepgemm.quantize_per_token_group(x.cuda())
    q_ref, sf_ref = quantize_per_token_group_reference(x)
    assert sf.shape == sf_ref.shape and sf.stride(0) == 1 and sf.stride(1) % 4 == 0
    assert torch.equal(sf.cpu(), sf_ref)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,k", [(8, 128), (136, 144), (2056, 7168), (7168, 2048)])
def test_per_block_matches_reference(n: int, k: int, dtype: torch.dtype) -> None:
    w = (torch.randn(n, k) * torch.exp(torch.randn(n, 1))).to(dtype)
    q, sf = deepgemm.quantize_per_block(w.cuda())
    q_ref, sf_ref = quantize_per_block_reference(w)
    assert torch.equal(sf.cpu(), sf_ref)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))


def test_zero_groups_give_finite_scales() -> None:
    x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    x[1] = 0
    x[2, 128:256] = 0
    q, sf = deepgemm.quantize_per_token_group(x)
    assert torch.isfinite(sf).all() and (sf > 0).all()
    assert (q[1].float() == 0).all() and (q[2, 128:256].float() == 0).all()
    w = torch.zeros(256, 256, device="cuda")
    qw, sfw = deepgemm.quantize_per_block(w)
    assert torch.isfinite(sfw).all() and (qw.float() == 0).all()


def test_round_trip_error_is_fp8_sized() -> None:
    x = torch.randn(512, 1024, device="cuda")
    q, sf = deepgemm.quantize_per_token_group(x)
    restored = deepgemm.dequantize_per_token_group(q, sf)
    assert deepgemm.calc_diff(restored, x) < 1e-3
    w = torch.randn(384, 640, device="cuda")
    qw, sfw = deepgemm.quantize_per_block(w)
    assert deepgemm.calc_diff(deepgemm.dequantize_per_block(qw, sfw), w) < 1e-3


def test_nan_groups_match_reference() -> None:
    x = torch.randn(8, 256)
    x[3, 10] = float("nan")
    q, sf = deepgemm.quantize_per_token_group(x.cuda())
    q_ref, sf_ref = quantize_per_token_group_reference(x)
    assert torch.equal(sf.cpu().isnan(), sf_ref.isnan()) and sf.cpu()[3, 0].isnan()
    finite = ~sf_ref.isnan()
    assert torch.equal(sf.cpu()[finite], sf_ref[finite])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("group_size", [32, 64, 128, 256, 1024])
@pytest.mark.parametrize("layout", ["contiguous", "column-offset", "odd-k", "padded-rows"])
def test_per_token_group_vector_and_scalar_paths(layout: str, group_size: int, dtype: torch.dtype) -> None:
    """The 16-byte path (aligned rows, K a multiple of the vector) and the scalar one give the reference's bits."""
    gen = torch.Generator().manual_seed(group_size)
    base = (torch.randn(203, 2100, generator=gen) * torch.exp(torch.randn(203, 1, generator=gen) * 2)).to(dtype)
    views = {"contiguous": lambda t: t[:, :2048].contiguous(), "column-offset": lambda t: t[:, 1:1025],
             "odd-k": lambda t: t[:, :1001], "padded-rows": lambda t: t[:, :1536]}  # rows 2100 elements apart
    x = views[layout](base)
    q, sf = deepgemm.quantize_per_token_group(views[layout](base.cuda()), group_size)
    q_ref, sf_ref = quantize_per_token_group_reference(x.contiguous(), group_size)
    assert torch.equal(sf.cpu(), sf_ref)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))
