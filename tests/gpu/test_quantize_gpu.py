"""GPU quantization kernels: bit-identical to the CPU reference, layouts the GEMM reads, no NaN on zeros."""

from __future__ import annotations

import pytest
import torch

import deepgemm
from deepgemm.kernels.quantize_fp8.launch import block_vectorizable
from deepgemm.reference import quantize_per_block_reference, quantize_per_token_group_reference
from tests.gpu.guard import GpuGuard
from tests.helpers import poison_allocator

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


def check_per_block(w: torch.Tensor, block: int, gpu_guard: GpuGuard) -> None:
    """quantize_per_block (and, for block 128, quantize_per_block_transposed) of the CUDA tensor w against the
    reference of its CPU copy, bit for bit, each kernel launched once, onto NaN-poisoned memory."""
    from deepgemm.ops.quant import quantize_per_block_transposed

    q_ref, sf_ref = quantize_per_block_reference(w.cpu().contiguous(), block)
    poison_allocator(w.shape[0] * w.shape[1])
    q, sf = deepgemm.quantize_per_block(w, block)
    assert gpu_guard.launches("deepgemm_quantize_per_block") == 1
    assert torch.equal(sf.cpu(), sf_ref)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))
    if block == 128:
        poison_allocator(w.shape[0] * w.shape[1])
        q, sf, qt, sft = quantize_per_block_transposed(w)
        assert gpu_guard.launches("deepgemm_quantize_per_block_transposed") == 1
        assert torch.equal(sf.cpu(), sf_ref) and torch.equal(sft.cpu(), sf_ref.t())
        assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))
        assert torch.equal(qt.cpu().view(torch.uint8), q_ref.t().view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("block", [32, 64, 128])
@pytest.mark.parametrize("layout", ["contiguous", "column-offset", "odd-k", "padded-rows"])
def test_per_block_vector_and_scalar_paths(layout: str, block: int, dtype: torch.dtype, seed: int,
                                           gpu_guard: GpuGuard) -> None:
    """The per-block kernel's 16-byte path (w's base and rows 16-byte aligned, K a whole number of vectors, a block
    layout that has them) and its scalar path (any layout): the reference's bits, with and without the transposed
    outputs, partial blocks at both edges."""
    gen = torch.Generator().manual_seed(seed)
    base = (torch.randn(203, 2100, generator=gen) * torch.exp(torch.randn(203, 1, generator=gen))).to(dtype)
    views = {"contiguous": lambda t: t[:, :2048].contiguous(), "column-offset": lambda t: t[:, 1:1025],
             "odd-k": lambda t: t[:, :1001], "padded-rows": lambda t: t[:, :1536]}  # rows 2100 elements apart
    w = views[layout](base.cuda())
    size, vector = dtype.itemsize, 16 // dtype.itemsize
    aligned = (w.storage_offset() * size % 16 == 0 and w.stride(0) * size % 16 == 0 and w.shape[1] % vector == 0)
    assert block_vectorizable(w, block) == (aligned and not (block == 32 and size == 2))  # the path this case takes
    check_per_block(w, block, gpu_guard)


@pytest.mark.parametrize("rows,cols,block,dtype", [(65535 * 32 + 33, 8, 32, torch.float32),
                                                   (65535 * 32 + 33, 8, 32, torch.bfloat16),
                                                   (65535 * 128 + 1, 16, 128, torch.bfloat16)])
def test_per_block_past_65535_row_blocks(rows: int, cols: int, block: int, dtype: torch.dtype, seed: int,
                                         gpu_guard: GpuGuard) -> None:
    """More than 65535 blocks along N (CUDA's grid y limit): the kernel walks the grid N-fastest there."""
    w = (torch.randn(rows, cols, device="cuda") * torch.exp(torch.randn(rows, 1, device="cuda"))).to(dtype)
    check_per_block(w, block, gpu_guard)


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


def hard_quotients(rows: int, cols: int, seed: int) -> torch.Tensor:
    """float32 rows whose 128-column groups make the division by the scale hard to get bit-exact: each group's
    scale s = amax / 448 is drawn over 2^-100..2^100 (the fused quotient's range and both sides of its 2^-90
    bound), one element holds the amax, the others sit next to e4m3 rounding points and float32 midpoints of x / s,
    are tiny or signed zeros; some groups have subnormal amaxes (the FLT_MIN scale, divided)."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    steps = torch.unique(codes[torch.isfinite(codes) & (codes >= 0)])
    midpoints = (steps[1:] + steps[:-1]) / 2
    groups = rows * (cols // 128)
    amax = torch.exp2(torch.empty(groups, 1).uniform_(-100, 100, generator=gen)).float()
    amax[::17] = torch.exp2(torch.empty(amax[::17].shape).uniform_(-149, -127, generator=gen))  # subnormal
    amax[1::13] = 448 * 2.0**-90 * (1 + torch.randint(-2, 3, amax[1::13].shape, generator=gen) * 2.0**-20)
    s = amax / 448  # float32 division, as the kernels form the scale
    pick = torch.randint(0, len(midpoints), (groups, 128), generator=gen)
    wiggle = 1 + torch.randint(-3, 4, (groups, 128), generator=gen).double() * 2.0**-24
    ratio = midpoints[pick].double() * wiggle  # x / s wanted, in float64; x is rounded to float32 once
    kind = torch.randint(0, 4, (groups, 128), generator=gen)
    uniform = torch.empty(groups, 128).uniform_(2.0**-11, 440, generator=gen)  # float32 quotients ...
    half_ulp = (torch.nextafter(uniform, torch.tensor(1e30)) - uniform).double() / 2
    ratio = torch.where(kind == 1, uniform.double() + half_ulp, ratio)  # ... plus half a float32 step
    ratio = torch.where(kind == 2, torch.exp2(torch.empty(groups, 128).uniform_(-40, -11, generator=gen)).double(),
                        ratio)
    x = (s.double() * ratio).float()
    x = torch.where(kind == 3, torch.zeros_like(x), x)
    sign = torch.where(torch.rand(groups, 128, generator=gen) < 0.5, -1.0, 1.0)
    x = x * sign  # (zeros become -0 half the time)
    x[:, 0] = amax[:, 0] * sign[:, 0]
    return x.reshape(rows, cols)


@pytest.mark.quick
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hard_quotients_are_bit_exact(dtype: torch.dtype, seed: int) -> None:
    """Every GPU quantizer divides by the group scale bit-identically to the reference's IEEE division, on values
    built to break a reciprocal multiply: per-token-group (vector and scalar paths), per block, transposed and
    both ways."""
    from deepgemm.ops.quant import quantize_both_ways, quantize_per_block_transposed, quantize_transposed

    x = hard_quotients(256, 1024, seed).to(dtype)
    xc = x.cuda()
    both = quantize_both_ways(xc.t().contiguous(), 1024)
    cases = {"token group": (deepgemm.quantize_per_token_group(xc), quantize_per_token_group_reference(x)),
             "token group, scalar": (deepgemm.quantize_per_token_group(xc[:, 1:1 + 896]),
                                     quantize_per_token_group_reference(x[:, 1:1 + 896])),
             "per block": (deepgemm.quantize_per_block(xc), quantize_per_block_reference(x, 128)),
             "per block, scalar": (deepgemm.quantize_per_block(xc[:, 1:1 + 896]),
                                   quantize_per_block_reference(x[:, 1:1 + 896], 128)),
             "per block + transposed": (quantize_per_block_transposed(xc)[:2], quantize_per_block_reference(x, 128)),
             "transposed": (quantize_transposed(xc.t().contiguous(), 1024), quantize_per_token_group_reference(x)),
             "both ways, transposed": (both[2:], quantize_per_token_group_reference(x)),
             "both ways, rows": (both[:2], quantize_per_token_group_reference(x.t().contiguous()))}
    for name, ((q, sf), (q_ref, sf_ref)) in cases.items():
        assert torch.equal(sf.cpu(), sf_ref), name
        assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8)), name
    assert (x.view(torch.int32 if dtype == torch.float32 else torch.int16) < 0).any()  # (negative zeros present)
