"""MoE grouped FP8 GEMMs as custom ops: contiguous (per-row indices or psum) and masked, functional and `_out`."""

from __future__ import annotations

import torch

from deepgemm.api import grouped as api
from deepgemm.ops.library import compiling, define

_Pair = tuple[torch.Tensor, torch.Tensor]


def _contiguous_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    return a.shape[0], b.shape[1]


def _empty(shape: tuple[int, ...], dtype: torch.dtype | None, like: torch.Tensor) -> torch.Tensor:
    dtype = torch.bfloat16 if dtype is None else dtype
    if dtype not in api.OUT_DTYPES:
        raise TypeError(f"'out_dtype' must be torch.bfloat16 or torch.float32, got {dtype}")
    return torch.empty(shape, dtype=dtype, device=like.device)


# ---- contiguous, per-row expert indices ---------------------------------------------------------------------


def _contiguous_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, m_indices: torch.Tensor,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = _empty(_contiguous_shape(a, b), out_dtype, a)
    return api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), out, m_indices)


def _contiguous_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, m_indices: torch.Tensor,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = _empty(_contiguous_shape(a, b), out_dtype, a)
    api.check_contiguous((a, sfa), (b, sfb), out, m_indices, psum_form=False)
    return out


def _contiguous_out_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                         m_indices: torch.Tensor, out: torch.Tensor) -> None:
    api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), out, m_indices)


def _contiguous_out_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                         m_indices: torch.Tensor, out: torch.Tensor) -> None:
    api.check_contiguous((a, sfa), (b, sfb), out, m_indices, psum_form=False)


define("m_grouped_fp8_gemm_nt_contiguous(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor m_indices, "
       "ScalarType? out_dtype=None) -> Tensor", _contiguous_impl, _contiguous_fake)
define("m_grouped_fp8_gemm_nt_contiguous_out(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor m_indices, "
       "Tensor(a!) out) -> ()", _contiguous_out_impl, _contiguous_out_fake)


# ---- contiguous, cumulative row ends ------------------------------------------------------------------------


def _psum_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, psum: torch.Tensor,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = _empty(_contiguous_shape(a, b), out_dtype, a)
    return api.m_grouped_fp8_gemm_nt_contiguous_psum((a, sfa), (b, sfb), out, psum)


def _psum_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, psum: torch.Tensor,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = _empty(_contiguous_shape(a, b), out_dtype, a)
    api.check_contiguous((a, sfa), (b, sfb), out, psum, psum_form=True)
    return out


def _psum_out_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, psum: torch.Tensor,
                   out: torch.Tensor) -> None:
    api.m_grouped_fp8_gemm_nt_contiguous_psum((a, sfa), (b, sfb), out, psum)


def _psum_out_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, psum: torch.Tensor,
                   out: torch.Tensor) -> None:
    api.check_contiguous((a, sfa), (b, sfb), out, psum, psum_form=True)


define("m_grouped_fp8_gemm_nt_contiguous_psum(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor psum, "
       "ScalarType? out_dtype=None) -> Tensor", _psum_impl, _psum_fake)
define("m_grouped_fp8_gemm_nt_contiguous_psum_out(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor psum, "
       "Tensor(a!) out) -> ()", _psum_out_impl, _psum_out_fake)


# ---- masked -------------------------------------------------------------------------------------------------


def _masked_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    return a.shape[0], a.shape[1], b.shape[1]


def _masked_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor,
                 expected_m: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = _empty(_masked_shape(a, b), out_dtype, a)
    api.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), out, masked_m, expected_m)
    # A functional result is fully defined: rows at or past masked_m[g] (unspecified or unwritten in the `_out`
    # form) are zero. Done on the device, so the op stays capturable.
    valid = torch.arange(out.shape[1], device=out.device)[None, :] < masked_m.to(out.device)[:, None]
    return out.masked_fill_(~valid[:, :, None], 0)


def _masked_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor,
                 expected_m: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = _empty(_masked_shape(a, b), out_dtype, a)
    api.check_masked((a, sfa), (b, sfb), out, masked_m, expected_m)
    return out


def _masked_out_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor,
                     expected_m: int, out: torch.Tensor) -> None:
    api.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), out, masked_m, expected_m)


def _masked_out_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor,
                     expected_m: int, out: torch.Tensor) -> None:
    api.check_masked((a, sfa), (b, sfb), out, masked_m, expected_m)


define("m_grouped_fp8_gemm_nt_masked(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor masked_m, int expected_m, "
       "ScalarType? out_dtype=None) -> Tensor", _masked_impl, _masked_fake)
define("m_grouped_fp8_gemm_nt_masked_out(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor masked_m, "
       "int expected_m, Tensor(a!) out) -> ()", _masked_out_impl, _masked_out_fake)


# ---- public functions ---------------------------------------------------------------------------------------


def m_grouped_fp8_gemm_nt_contiguous(a: _Pair, b: _Pair, out: torch.Tensor, m_indices: torch.Tensor) -> torch.Tensor:
    if not compiling():
        return api.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices)
    torch.ops.deepgemm.m_grouped_fp8_gemm_nt_contiguous_out(a[0], a[1], b[0], b[1], m_indices, out)
    return out


def m_grouped_fp8_gemm_nt_contiguous_psum(a: _Pair, b: _Pair, out: torch.Tensor, psum: torch.Tensor) -> torch.Tensor:
    if not compiling():
        return api.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, psum)
    torch.ops.deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum_out(a[0], a[1], b[0], b[1], psum, out)
    return out


def m_grouped_fp8_gemm_nt_masked(a: _Pair, b: _Pair, out: torch.Tensor, masked_m: torch.Tensor,
                                 expected_m: int) -> torch.Tensor:
    if not compiling():
        return api.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m)
    torch.ops.deepgemm.m_grouped_fp8_gemm_nt_masked_out(a[0], a[1], b[0], b[1], masked_m, expected_m, out)
    return out


m_grouped_fp8_gemm_nt_contiguous.__doc__ = api.m_grouped_fp8_gemm_nt_contiguous.__doc__
m_grouped_fp8_gemm_nt_contiguous_psum.__doc__ = api.m_grouped_fp8_gemm_nt_contiguous_psum.__doc__
m_grouped_fp8_gemm_nt_masked.__doc__ = api.m_grouped_fp8_gemm_nt_masked.__doc__
