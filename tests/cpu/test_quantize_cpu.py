"""quantize_per_token_group / quantize_per_block on CPU against scales and codes computed here."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import deepgemm
from deepgemm.utils import calc_diff

FP8 = torch.float8_e4m3fn
FLT_MIN = torch.finfo(torch.float32).tiny
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _gen() -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(torch.seed() % (2**31))
    return gen


def random_input(rows: int, cols: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Normal data whose rows differ in magnitude by orders of magnitude (kept inside fp16's range)."""
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    x = x * torch.exp(torch.randn(rows, 1, generator=gen, dtype=torch.float64) * 1.5)
    return x.to(dtype)


def scale_rule(amax64: torch.Tensor) -> torch.Tensor:
    """max(amax / 448, FLT_MIN), in float64, then rounded to float32."""
    return torch.clamp(amax64 / 448.0, min=FLT_MIN).to(torch.float32)


def expected_token_group(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    groups = math.ceil(k / group)
    x64 = x.to(torch.float64)
    sf = torch.empty(m, groups, dtype=torch.float32)
    q = torch.empty(m, k, dtype=FP8)
    for g in range(groups):
        lo, hi = g * group, min(k, (g + 1) * group)
        chunk = x64[:, lo:hi]
        scale = scale_rule(chunk.abs().amax(dim=1))
        sf[:, g] = scale
        # IEEE float32 division of float32 operands == float64 division rounded once to float32.
        q[:, lo:hi] = (chunk / scale.to(torch.float64).unsqueeze(1)).to(torch.float32).to(FP8)
    return q, sf


def expected_block(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    nb, kb = math.ceil(n / block), math.ceil(k / block)
    w64 = w.to(torch.float64)
    sf = torch.empty(nb, kb, dtype=torch.float32)
    q = torch.empty(n, k, dtype=FP8)
    for i in range(nb):
        for j in range(kb):
            tile = w64[i * block:(i + 1) * block, j * block:(j + 1) * block]
            scale = scale_rule(tile.abs().max())
            sf[i, j] = scale
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = (tile / float(scale)).to(torch.float32).to(FP8)
    return q, sf


def e4m3_round(v: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even onto the e4m3 grid (3 mantissa bits, min normal 2^-6), in float64.

    Written from the format definition, independently of torch's float8 conversion.
    """
    v = v.to(torch.float64)
    _, exponent = torch.frexp(v)  # v = mantissa * 2^exponent with |mantissa| in [0.5, 1)
    step = torch.pow(2.0, (exponent - 4).to(torch.float64)).clamp(min=2.0**-9)
    return torch.round(v / step) * step  # torch.round rounds half to even


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 128), (7, 300), (65, 1000), (129, 144)])
def test_token_group_scales_and_codes(dtype: torch.dtype, m: int, k: int) -> None:
    x = random_input(m, k, dtype, _gen())
    q, sf = deepgemm.quantize_per_token_group(x)
    want_q, want_sf = expected_token_group(x, 128)
    assert q.dtype == FP8 and q.shape == (m, k)
    assert sf.dtype == torch.float32 and sf.shape == (m, math.ceil(k / 128))
    assert torch.equal(sf, want_sf)
    assert same_bits(q, want_q)
    # And against the e4m3 grid derived from the format itself.
    ratio = x.to(torch.float64) / sf.to(torch.float64).repeat_interleave(128, dim=1)[:, :k]
    assert torch.equal(q.to(torch.float64), e4m3_round(ratio.to(torch.float32)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(200, 300), (128, 128), (1, 7), (129, 1000)])
def test_block_scales_and_codes(dtype: torch.dtype, n: int, k: int) -> None:
    w = random_input(n, k, dtype, _gen())
    q, sf = deepgemm.quantize_per_block(w)
    want_q, want_sf = expected_block(w, 128)
    assert q.dtype == FP8 and q.shape == (n, k)
    assert sf.dtype == torch.float32 and sf.shape == (math.ceil(n / 128), math.ceil(k / 128))
    assert torch.equal(sf, want_sf)
    assert same_bits(q, want_q)
    scale = sf.to(torch.float64).repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    assert torch.equal(q.to(torch.float64), e4m3_round((w.to(torch.float64) / scale).to(torch.float32)))


def test_partial_last_group_uses_only_its_own_elements() -> None:
    """K=300: the last group holds 44 elements; its scale must not see padding or other groups."""
    x = torch.zeros(2, 300)
    x[0, :256] = 1000.0
    x[0, 256:] = torch.linspace(-3.0, 2.0, 44)
    x[1, 299] = -0.5
    q, sf = deepgemm.quantize_per_token_group(x)
    assert sf[0, 2].item() == pytest.approx(3.0 / 448, rel=1e-7)
    assert sf[0, 0].item() == pytest.approx(1000.0 / 448, rel=1e-7)
    assert sf[1, 2].item() == pytest.approx(0.5 / 448, rel=1e-7)
    assert q[0, 256].float().item() == -448.0
    assert q[1, 299].float().item() == -448.0
    w = torch.zeros(200, 300)
    w[199, 299] = 7.0
    w[0, 0] = -2.0
    qw, sfw = deepgemm.quantize_per_block(w)
    assert sfw.shape == (2, 3)
    assert sfw[1, 2].item() == pytest.approx(7.0 / 448, rel=1e-7)
    assert sfw[0, 0].item() == pytest.approx(2.0 / 448, rel=1e-7)
    assert qw[199, 299].float().item() == 448.0
    assert qw[0, 0].float().item() == -448.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_zero_groups(dtype: torch.dtype) -> None:
    x = random_input(5, 300, dtype, _gen())
    x[1] = 0
    x[3, 128:256] = 0
    q, sf = deepgemm.quantize_per_token_group(x)
    assert torch.isfinite(sf).all() and (sf > 0).all()
    assert torch.equal(sf[1], torch.full((3,), FLT_MIN))
    assert sf[3, 1].item() == FLT_MIN
    assert not torch.isnan(q.float()).any()
    assert (q[1].float() == 0).all() and (q[3, 128:256].float() == 0).all()
    w = random_input(200, 300, dtype, _gen())
    w[128:, :] = 0
    qw, sfw = deepgemm.quantize_per_block(w)
    assert torch.isfinite(sfw).all() and (sfw > 0).all()
    assert torch.equal(sfw[1], torch.full((3,), FLT_MIN))
    assert not torch.isnan(qw.float()).any() and (qw[128:].float() == 0).all()
    for deq in (deepgemm.dequantize_per_token_group(q, sf), deepgemm.dequantize_per_block(qw, sfw)):
        assert torch.isfinite(deq).all()


def test_tiny_group_gets_the_floor_scale() -> None:
    """amax/448 below FLT_MIN: the scale is FLT_MIN and the codes are x / FLT_MIN rounded."""
    x = torch.tensor([[1e-40, -3e-41, 0.0, 5e-39] + [0.0] * 124])
    q, sf = deepgemm.quantize_per_token_group(x)
    assert sf.item() == FLT_MIN
    want = (x.to(torch.float64) / FLT_MIN).to(torch.float32).to(FP8)
    assert same_bits(q, want)
    assert q[0, 3].float().item() == pytest.approx(5e-39 / FLT_MIN, rel=2**-4)


@pytest.mark.parametrize("m", [1, 2, 5, 8, 13])
@pytest.mark.parametrize("k", [100, 128, 300])
def test_token_group_sf_is_m_major(m: int, k: int) -> None:
    x = random_input(m, k, torch.bfloat16, _gen())
    _, sf = deepgemm.quantize_per_token_group(x)
    aligned = -(-m // 4) * 4
    assert sf.stride() == (1, aligned)
    assert sf.data_ptr() % 16 == 0
    # The GEMM uses it as is.
    assert deepgemm.to_mn_major_tma_aligned(sf) is sf


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [64, 128, 256])
def test_token_group_round_trip(dtype: torch.dtype, group: int) -> None:
    x = random_input(33, 1000, dtype, _gen())
    q, sf = deepgemm.quantize_per_token_group(x, group)
    assert sf.shape == (33, math.ceil(1000 / group))
    want_q, want_sf = expected_token_group(x, group)
    assert torch.equal(sf, want_sf) and same_bits(q, want_q)
    deq = deepgemm.dequantize_per_token_group(q, sf, group)
    assert deq.dtype == torch.float32
    x64 = x.to(torch.float64)
    assert calc_diff(deq, x64) < 1e-3
    # Element-wise: half an e4m3 step (2^-4 relative, or 2^-10 * scale in the subnormal range).
    scale = sf.to(torch.float64).repeat_interleave(group, 1)[:, :1000]
    assert ((deq.to(torch.float64) - x64).abs() <= 2**-4 * x64.abs() + 2**-10 * scale).all()
    deq_bf16 = deepgemm.dequantize_per_token_group(q, sf, group, torch.bfloat16)
    assert deq_bf16.dtype == torch.bfloat16
    assert calc_diff(deq_bf16, x64) < 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [32, 64, 128])
def test_block_round_trip(dtype: torch.dtype, block: int) -> None:
    w = random_input(200, 300, dtype, _gen())
    q, sf = deepgemm.quantize_per_block(w, block)
    want_q, want_sf = expected_block(w, block)
    assert torch.equal(sf, want_sf) and same_bits(q, want_q)
    deq = deepgemm.dequantize_per_block(q, sf, block)
    w64 = w.to(torch.float64)
    # Rows differ in magnitude by design, so a block's scale can dwarf its smaller rows: compare
    # with the error bound rather than calc_diff alone.
    assert calc_diff(deq, w64) < 1e-3
    scale = sf.to(torch.float64).repeat_interleave(block, 0).repeat_interleave(block, 1)[:200, :300]
    assert ((deq.to(torch.float64) - w64).abs() <= 2**-4 * w64.abs() + 2**-10 * scale).all()


def test_round_trip_on_normal_data() -> None:
    gen = _gen()
    x = torch.randn(256, 2048, generator=gen)
    q, sf = deepgemm.quantize_per_token_group(x)
    assert calc_diff(deepgemm.dequantize_per_token_group(q, sf), x) < 1e-3
    qw, sfw = deepgemm.quantize_per_block(x)
    assert calc_diff(deepgemm.dequantize_per_block(qw, sfw), x) < 1e-3


def test_non_contiguous_input() -> None:
    x = random_input(300, 65, torch.float32, _gen()).t()  # [65, 300], column stride 65
    q, sf = deepgemm.quantize_per_token_group(x)
    want_q, want_sf = expected_token_group(x, 128)
    assert torch.equal(sf, want_sf) and same_bits(q, want_q)
    qw, sfw = deepgemm.quantize_per_block(x)
    want_qw, want_sfw = expected_block(x, 128)
    assert torch.equal(sfw, want_sfw) and same_bits(qw, want_qw)


def test_empty_inputs() -> None:
    q, sf = deepgemm.quantize_per_token_group(torch.zeros(0, 300))
    assert q.shape == (0, 300) and sf.shape == (0, 3)
    q, sf = deepgemm.quantize_per_token_group(torch.zeros(5, 0))
    assert q.shape == (5, 0) and sf.shape == (5, 0)
    qw, sfw = deepgemm.quantize_per_block(torch.zeros(0, 300))
    assert qw.shape == (0, 300) and sfw.shape == (0, 3)
    qw, sfw = deepgemm.quantize_per_block(torch.zeros(5, 0))
    assert qw.shape == (5, 0) and sfw.shape == (1, 0)


def test_dequantize_checks_its_arguments() -> None:
    q, sf = deepgemm.quantize_per_token_group(torch.randn(5, 300))
    with pytest.raises(ValueError, match="'sf'"):
        deepgemm.dequantize_per_token_group(q, sf[:, :2])
    with pytest.raises(TypeError, match="'q'"):
        deepgemm.dequantize_per_token_group(q.float(), sf)
    with pytest.raises(ValueError, match="group_size"):
        deepgemm.dequantize_per_token_group(q, sf, 100)
    qw, sfw = deepgemm.quantize_per_block(torch.randn(200, 300))
    with pytest.raises(ValueError, match="'sf'"):
        deepgemm.dequantize_per_block(qw, sfw.t())
    with pytest.raises(ValueError, match="block"):
        deepgemm.dequantize_per_block(qw, sfw, 256)


@pytest.mark.parametrize("group_size", [100, 0, -128, True, 128.0, 16, 2048, "128", None])
def test_invalid_group_size(group_size) -> None:
    x = torch.randn(4, 256)
    with pytest.raises(ValueError, match="group_size"):
        deepgemm.quantize_per_token_group(x, group_size)


@pytest.mark.parametrize("block", [256, 100, 0, True, 128.0, 16, -64])
def test_invalid_block(block) -> None:
    w = torch.randn(4, 256)
    with pytest.raises(ValueError, match="block"):
        deepgemm.quantize_per_block(w, block)


def _silu_mul_float64(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.double().chunk(2, dim=1)
    return torch.nn.functional.silu(gate) * up


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,width", [(1, 256), (37, 200), (130, 1536), (5, 2 * 7168)])
def test_silu_mul_quantize_against_float64(dtype: torch.dtype, m: int, width: int, seed: int) -> None:
    x = (torch.randn(m, width) * 4 * torch.exp(torch.randn(m, 1))).to(dtype)
    q, sf = deepgemm.silu_mul_quantize_per_token_group(x)
    k = width // 2
    assert q.shape == (m, k) and q.dtype == torch.float8_e4m3fn
    assert sf.shape == (m, -(-k // 128)) and sf.stride() == (1, -(-m // 4) * 4)
    ref = _silu_mul_float64(x)
    deq = deepgemm.dequantize_per_token_group(q, sf, dtype=torch.float64)
    # Each element within half an e4m3 step of its value (3 mantissa bits: 2^-4 relative), plus the float32
    # activation's own error; the scale is the group's amax / 448 as computed in float32.
    groups = torch.nn.functional.pad(ref.abs(), (0, sf.shape[1] * 128 - k)).view(m, -1, 128).amax(dim=2)
    assert torch.allclose(sf.double(), (groups / 448).clamp(min=torch.finfo(torch.float32).tiny), rtol=1e-5)
    assert ((deq - ref).abs() <= ref.abs() * 2**-4 + sf.double().repeat_interleave(128, 1)[:, :k] * 2**-9 + 1e-6).all()


def test_silu_mul_quantize_checks_its_input(seed: int) -> None:
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="odd count"):
        deepgemm.silu_mul_quantize_per_token_group(x[:, :255])
    with pytest.raises(ValueError, match="'x'"):
        deepgemm.silu_mul_quantize_per_token_group(x[0])
    with pytest.raises(TypeError, match="'x'"):
        deepgemm.silu_mul_quantize_per_token_group(x.to(torch.int32))
    with pytest.raises(ValueError, match="'group_size'"):
        deepgemm.silu_mul_quantize_per_token_group(x, 100)
    with pytest.raises(deepgemm.NotDifferentiableError, match="'x'"):
        deepgemm.silu_mul_quantize_per_token_group(x.float().requires_grad_())
    # Non-unit column stride and empty inputs.
    wide = torch.randn(256, 6, dtype=torch.bfloat16).t()
    q, sf = deepgemm.silu_mul_quantize_per_token_group(wide)
    q2, sf2 = deepgemm.silu_mul_quantize_per_token_group(wide.contiguous())
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(sf, sf2)
    for shape in ((0, 256), (3, 0)):
        q, sf = deepgemm.silu_mul_quantize_per_token_group(torch.empty(shape))
        assert q.shape == (shape[0], shape[1] // 2) and sf.shape == (shape[0], -(-(shape[1] // 2) // 128))


def test_warm_token_group_calls_skip_the_checks(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """A call whose input metadata (shape, strides, dtype, device, group size) already passed the checks on the kernel
    path goes straight to the kernel; new metadata, an input that needs a copy, a grad-requiring input in grad mode and
    the gated variant (keyed apart) take the checked path, so every error is still raised."""
    from deepgemm.api import quant as api
    from deepgemm.reference import quantize_per_token_group_reference, silu_mul_reference

    launched: list[tuple[tuple[int, ...], int, bool]] = []

    def kernel(x: torch.Tensor, group_size: int, silu_mul: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        launched.append((tuple(x.shape), group_size, silu_mul))
        q, sf = quantize_per_token_group_reference(silu_mul_reference(x) if silu_mul else x, group_size)
        return q, api._as_mn_major(sf)

    transposed: list[tuple[tuple[int, ...], int]] = []

    def transposed_kernel(x: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        transposed.append((tuple(x.shape), tokens))
        q, sf = quantize_per_token_group_reference(x.t(), 128)
        return q, api._as_mn_major(sf)

    checked: list[str] = []
    real_check, real_silu_check = api.check_quantize_input, api.check_silu_mul_input

    def counted(*args: object) -> torch.Tensor:
        checked.append("plain")
        return real_check(*args)  # type: ignore[arg-type]

    def counted_silu(*args: object) -> torch.Tensor:
        checked.append("silu")
        return real_silu_check(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "_kernel_ready", {})
    monkeypatch.setattr(api, "backend_for", lambda *tensors, **kw: "sm90")
    monkeypatch.setattr(api, "quantize_per_token_group_cuda", kernel)
    monkeypatch.setattr(api, "quantize_transposed_cuda", transposed_kernel)
    monkeypatch.setattr(api, "check_quantize_input", counted)
    monkeypatch.setattr(api, "check_silu_mul_input", counted_silu)
    x = torch.randn(16, 512).to(torch.bfloat16)
    first = deepgemm.quantize_per_token_group(x)
    again = deepgemm.quantize_per_token_group(x.clone())  # another tensor, the same metadata
    assert checked == ["plain"] and len(launched) == 2
    assert torch.equal(first[1], again[1]) and again[1].stride() == (1, 16)
    deepgemm.quantize_per_token_group(x, 64)  # another group size
    deepgemm.quantize_per_token_group(x[:8])  # another shape
    strided = torch.randn(512, 16).to(torch.bfloat16)[:, ::2].t()  # neither unit stride: copied, never remembered
    deepgemm.quantize_per_token_group(strided)
    deepgemm.quantize_per_token_group(strided)
    assert checked == ["plain"] * 5 and len(launched) == 6
    columns = torch.randn(512, 16).to(torch.bfloat16).t()  # column-major: the transposed kernel, remembered
    deepgemm.quantize_per_token_group(columns)
    deepgemm.quantize_per_token_group(columns)
    deepgemm.quantize_per_token_group(columns, 64)  # only groups of 128 take it: copied, then the row kernel
    assert checked == ["plain"] * 7 and len(transposed) == 2 and len(launched) == 7
    assert transposed[0] == ((512, 16), 512)  # x.t() read in place, no padding
    deepgemm.silu_mul_quantize_per_token_group(x)
    deepgemm.silu_mul_quantize_per_token_group(x)
    assert checked[7:] == ["silu", "plain"] and launched[-1] == ((16, 512), 128, True)  # (its check calls the plain one)
    leaf = x.float().requires_grad_()
    deepgemm.quantize_per_token_group(leaf.detach())  # warm for float32 [16, 512]
    with pytest.raises(deepgemm.NotDifferentiableError):
        deepgemm.quantize_per_token_group(leaf)
    with pytest.raises(ValueError, match="'group_size' must be one of"):  # (True == 1 as a key; never the warm path)
        deepgemm.quantize_per_token_group(x, True)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the GPU quantizers' division (FusedQuotient)
# The kernels divide by a group's scale with FusedQuotient (quantize_fp8.cuh): inverse = RN(1/s), q0 = RN(x inverse),
# t = RN(s q0 - x) (an FMA), q = RN(q0 - t inverse) (an FMA), for s in [2^-90, 2^120]. The sequence is replayed
# here in exact rational arithmetic, each step rounded to float32 as the hardware does, against the correctly
# rounded x / s: the same float32 bits wherever |x / s| >= 2^-11, and a zero-bound pair of the same sign below
# (both round to that signed zero in e4m3, whose smallest step is 2^-9).


def _rn32(value: Fraction) -> float:
    """value rounded to the nearest float32 (ties to even; subnormals; a zero keeps value's sign)."""
    guess = np.float32(float(value))
    candidates = (guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(-np.inf)))
    best = min(candidates, key=lambda c: (abs(Fraction(float(c)) - value), int(np.float32(c).view(np.uint32)) & 1))
    if best == 0:
        return -0.0 if value < 0 else 0.0
    return float(best)


def _negative(value: float) -> bool:
    return math.copysign(1.0, value) < 0


def _fma32(a: float, b: float, c: float) -> float:
    """RN(a b + c) with IEEE's signed zeros: an exact zero sum is -0 only when a b and c are both -0."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact != 0:
        return _rn32(exact)
    both_negative_zeros = a * b == 0 and c == 0 and (_negative(a) != _negative(b)) and _negative(c)
    return -0.0 if both_negative_zeros else 0.0


def _fused_quotient(x: float, s: float) -> float:
    inverse = _rn32(1 / Fraction(s))
    q0 = _fma32(x, inverse, -0.0)  # RN(x * inverse) (adding -0 keeps a product's zero sign)
    t = _fma32(s, q0, -x)
    return _fma32(-t, inverse, q0)


def _divided(x: float, s: float) -> float:
    return _rn32(Fraction(x) / Fraction(s)) if x != 0 else x


def _same_e4m3_code(fused: float, divided: float) -> bool:
    if np.float32(fused).view(np.uint32) == np.float32(divided).view(np.uint32):
        return True
    return abs(fused) < 2.0**-11 and abs(divided) < 2.0**-11 and _negative(fused) == _negative(divided)


def test_fused_quotient_is_the_division(seed: int) -> None:
    rng = np.random.default_rng(seed)
    e4m3_steps = np.array(sorted({float(v) for v in torch.arange(256, dtype=torch.uint8).view(FP8).float()
                                  if math.isfinite(float(v)) and v >= 0}))
    midpoints = (e4m3_steps[1:] + e4m3_steps[:-1]) / 2  # where e4m3 rounding turns
    cases = []
    for _ in range(400):
        s = float(np.float32(2.0 ** rng.uniform(-90, 119)))
        for _ in range(12):
            kind = rng.integers(4)
            if kind == 0:  # anywhere in the group's range
                x = rng.uniform(-448, 448) * s
            elif kind == 1:  # next to an e4m3 rounding point, a few float32 steps either side
                x = float(rng.choice(midpoints)) * s * (1 + rng.integers(-4, 5) * 2.0**-24)
            elif kind == 2:  # x / s next to the midpoint of two float32 values: the correction step decides
                q = np.float32(rng.uniform(2.0**-11, 448))
                x = (float(q) + float(np.nextafter(q, np.float32(np.inf)) - q) / 2) * s
            else:  # tiny: quotients from 2^-40 down into float32's subnormals
                x = s * 2.0 ** rng.uniform(-40, -11) if rng.integers(2) else 2.0 ** rng.uniform(-149, -102)
            x = float(np.float32(x * (1 if rng.integers(2) else -1)))
            if math.isfinite(x) and abs(x) <= 448 * s:
                cases.append((x, s))
    cases += [(0.0, 1.0), (-0.0, 1.0), (-0.0, 2.0**-90), (448.0 * 2.0**-90, 2.0**-90), (-2.0**-149, 2.0**-90),
              (float(np.float32(3.0e38)), float(np.float32(3.0e38 / 448)))]
    wrong = [(x, s, _fused_quotient(x, s), _divided(x, s)) for x, s in cases
             if not _same_e4m3_code(_fused_quotient(x, s), _divided(x, s))]
    assert not wrong, wrong[:5]
    exact = sum(np.float32(_fused_quotient(x, s)).view(np.uint32) == np.float32(_divided(x, s)).view(np.uint32)
                for x, s in cases)
    assert exact >= 0.8 * len(cases)  # (most cases are the bit-exact kind, not the tiny-quotient kind)
