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


@pytest.mark.quick
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["vector", "column-offset", "odd-width", "padded-rows", "tall"])
def test_silu_mul_quantize_matches_the_reference_within_an_e4m3_step(layout: str, dtype: torch.dtype,
                                                                     seed: int) -> None:
    """The fused activation + quantizer on both kernel paths against the CPU reference (its exp may differ in the
    last bit: codes at most one e4m3 step apart, almost all equal) and against float64."""
    gen = torch.Generator().manual_seed(seed)
    rows = 4099 if layout == "tall" else 203
    # Rows 3104 elements apart (16-byte multiples): every view but odd-width (the scalar path) is vectorized.
    base = (torch.randn(rows, 3104, generator=gen) * 3 * torch.exp(torch.randn(rows, 1, generator=gen))).to(dtype)
    views = {"vector": lambda t: t[:, :2 * 768].contiguous(), "column-offset": lambda t: t[:, 8:8 + 2 * 1024],
             "odd-width": lambda t: t[:, :2 * 1001], "padded-rows": lambda t: t[:, :2 * 1536],
             "tall": lambda t: t[:, :2 * 1408]}
    x_cpu = views[layout](base)
    x = views[layout](base.cuda())
    q, sf = deepgemm.silu_mul_quantize_per_token_group(x)
    torch.cuda.synchronize()
    q_ref, sf_ref = deepgemm.silu_mul_quantize_per_token_group(x_cpu)
    assert q.shape == q_ref.shape and sf.stride() == sf_ref.stride()
    assert torch.allclose(sf.cpu(), sf_ref, rtol=2e-6, atol=0)
    deq = deepgemm.dequantize_per_token_group(q.cpu(), sf.cpu(), dtype=torch.float64)
    deq_ref = deepgemm.dequantize_per_token_group(q_ref, sf_ref, dtype=torch.float64)
    step = deq_ref.abs() * 2**-3 + sf_ref.double().repeat_interleave(128, 1)[:, :q.shape[1]] * 2**-9
    assert ((deq - deq_ref).abs() <= step + 1e-12).all()
    assert (q.cpu().view(torch.uint8) != q_ref.view(torch.uint8)).float().mean() < 1e-3
    gate, up = x_cpu.double().chunk(2, dim=1)
    assert deepgemm.calc_diff(deq, torch.nn.functional.silu(gate) * up) < 1e-3
