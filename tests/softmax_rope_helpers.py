"""Float64 formulas and element bounds for deepgemm.softmax and deepgemm.rope, shared by the CPU and GPU tests
(written from the definitions, independently of deepgemm.reference)."""

from __future__ import annotations

import torch

# Half an ulp of each output dtype (relative): the rounding of a float32 result.
HALF_ULP = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-9, torch.float16: 2.0**-11}
# Smallest spacing near zero (subnormals) of each output dtype: an absolute floor for the element bounds.
TINY = {torch.float32: 1e-40, torch.bfloat16: 1e-40, torch.float16: 2.0**-24}
NAN = float("nan")
INF = float("inf")


# ---------------------------------------------------------------------------------------------- float64 formulas


def softmax64(x: torch.Tensor, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
    """softmax(scale * x) over the last dimension in float64; causal: x as [..., sq, n], key j hidden from query i
    where j > i + n - sq, and a query that sees no key gives zeros."""
    s = x.double() * scale
    n = s.shape[-1]
    if causal:
        sq = s.shape[-2]
        i = torch.arange(sq).unsqueeze(1)
        j = torch.arange(n).unsqueeze(0)
        hidden = j > i + (n - sq)
        s = s.masked_fill(hidden, -INF)
    m = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - m)
    y = e / e.sum(dim=-1, keepdim=True)
    if causal:
        y = y.masked_fill(hidden, 0.0).masked_fill(hidden.all(dim=-1, keepdim=True), 0.0)
    return y


def pair_indices(rotary: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Feature indices (x1, x2) of the rotary pairs: (2p, 2p + 1) interleaved, else (p, p + R/2)."""
    half = rotary // 2
    if interleaved:
        return torch.arange(0, rotary, 2), torch.arange(1, rotary, 2)
    return torch.arange(half), torch.arange(half, rotary)


def rope64(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, interleaved: bool,
           inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [T, H, D] rotated in float64, the magnitude |x1 cos| + |x2 sin| behind each rotated feature (the scale of
    float32 rounding error; 0 on pass-through features)). A position outside [0, P) gives NaN rotated features."""
    rotary = cache.shape[1]
    half = rotary // 2
    pos = positions.long()
    valid = (pos >= 0) & (pos < cache.shape[0])
    rows = cache.double()[torch.where(valid, pos, 0)]
    rows[~valid] = NAN
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    if inverse:
        sin = -sin
    i1, i2 = pair_indices(rotary, interleaved)
    x64 = x.double()
    x1, x2 = x64[..., i1], x64[..., i2]
    out = x64.clone()
    out[..., i1] = x1 * cos - x2 * sin
    out[..., i2] = x2 * cos + x1 * sin
    mag = torch.zeros_like(x64)
    pair_mag = (x1 * cos).abs() + (x2 * sin).abs()
    mag[..., i1] = pair_mag
    mag[..., i2] = pair_mag
    return out, mag


def rope_cache(positions: int, rotary: int, dtype: torch.dtype, base: float = 10000.0) -> torch.Tensor:
    """A [positions, rotary] cos / sin cache as models build it (cos half, then sin half)."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)


# ---------------------------------------------------------------------------------------------- assertions


def assert_softmax_close(y: torch.Tensor, ref: torch.Tensor, what: str, rtol: float | None = None) -> None:
    """Every element within float32 math error plus the output dtype's rounding: |y - ref| <= rtol |ref| + tiny
    (rtol by default 1e-5 for float32, one ulp of bfloat16 / float16), the same NaN positions."""
    assert y.shape == ref.shape, f"{what}: shape {tuple(y.shape)} != {tuple(ref.shape)}"
    if rtol is None:
        rtol = 1e-5 if y.dtype == torch.float32 else 2 * HALF_ULP[y.dtype]
    y64 = y.double().cpu()
    assert torch.equal(y64.isnan(), ref.isnan()), f"{what}: NaN positions differ"
    finite = ~ref.isnan()
    excess = ((y64 - ref).abs() - rtol * ref.abs() - TINY[y.dtype])[finite]
    assert excess.numel() == 0 or excess.max().item() <= 0, f"{what}: exceeds the bound by {excess.max().item():.3e}"


def assert_rotation_close(out: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, what: str) -> None:
    """Rotated features within float32 error of the products (2^-21 of |x1 cos| + |x2 sin|) plus the output's
    rounding; same NaN positions."""
    assert out.shape == ref.shape and out.dtype in HALF_ULP, what
    o = out.double().cpu()
    assert torch.equal(o.isnan(), ref.isnan()), f"{what}: NaN positions differ"
    finite = ~ref.isnan()
    bound = 2 * HALF_ULP[out.dtype] * ref.abs() + 2.0**-21 * mag + TINY[out.dtype]
    excess = ((o - ref).abs() - bound)[finite]
    assert excess.numel() == 0 or excess.max().item() <= 0, f"{what}: exceeds the bound by {excess.max().item():.3e}"


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)) if a.numel() else a.shape == b.shape
