"""MoE grouped FP8 GEMMs as custom ops: contiguous (per-row indices or psum) and masked, functional and `_out`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from deepgemm.api import grouped as api
from deepgemm.ops.library import (compiling, define, empty_out, refuse_validate_when_compiling, require_ranks,
                                   traced_pairs)

_Pair = tuple[torch.Tensor, torch.Tensor]


def _contiguous_shape(where: str, a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    require_ranks(where, ("a[0]", a, 2), ("b[0]", b, 3))
    return a.shape[0], b.shape[1]



# ---- contiguous: per-row expert indices (m_indices) or cumulative row ends (psum) ----------------------------


def _define_contiguous(name: str, grouping_name: str, run: Callable[..., torch.Tensor], psum_form: bool) -> None:
    """Register the functional and `_out` ops of one contiguous form; `run` is its api function."""
    def impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, grouping: torch.Tensor,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return run((a, sfa), (b, sfb), empty_out(_contiguous_shape(name, a, b), out_dtype, a), grouping)

    def fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, grouping: torch.Tensor,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
        out = empty_out(_contiguous_shape(name, a, b), out_dtype, a)
        api.check_contiguous((a, sfa), (b, sfb), out, grouping, psum_form=psum_form)
        return out

    def out_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, grouping: torch.Tensor,
                 out: torch.Tensor) -> None:
        run((a, sfa), (b, sfb), out, grouping)

    def out_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, grouping: torch.Tensor,
                 out: torch.Tensor) -> None:
        api.check_contiguous((a, sfa), (b, sfb), out, grouping, psum_form=psum_form)

    operands = f"Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor {grouping_name}"
    define(f"{name}({operands}, ScalarType? out_dtype=None) -> Tensor", impl, fake)
    define(f"{name}_out({operands}, Tensor(a!) out) -> ()", out_impl, out_fake)


_define_contiguous("m_grouped_fp8_gemm_nt_contiguous", "m_indices", api.m_grouped_fp8_gemm_nt_contiguous, False)
_define_contiguous("m_grouped_fp8_gemm_nt_contiguous_psum", "psum", api.m_grouped_fp8_gemm_nt_contiguous_psum, True)


# ---- masked -------------------------------------------------------------------------------------------------


def _masked_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    require_ranks("m_grouped_fp8_gemm_nt_masked", ("a[0]", a, 3), ("b[0]", b, 3))
    return a.shape[0], a.shape[1], b.shape[1]


def _masked_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor,
                 expected_m: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = empty_out(_masked_shape(a, b), out_dtype, a)
    api.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), out, masked_m, expected_m)
    # A functional result is fully defined: rows at or past masked_m[g] (unspecified or unwritten in the `_out`
    # form) are zero. Done on the device, so the op stays capturable.
    valid = torch.arange(out.shape[1], device=out.device)[None, :] < masked_m.to(out.device)[:, None]
    return out.masked_fill_(~valid[:, :, None], 0)


def _masked_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, masked_m: torch.Tensor,
                 expected_m: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = empty_out(_masked_shape(a, b), out_dtype, a)
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



def m_grouped_fp8_gemm_nt_contiguous(a: _Pair, b: _Pair, out: torch.Tensor, m_indices: torch.Tensor, *,
                                     validate: bool = False) -> torch.Tensor:
    if not compiling():
        return api.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices, validate=validate)
    if validate:
        refuse_validate_when_compiling("m_grouped_fp8_gemm_nt_contiguous")
    a, b = traced_pairs("m_grouped_fp8_gemm_nt_contiguous", a, b)
    torch.ops.deepgemm.m_grouped_fp8_gemm_nt_contiguous_out(a[0], a[1], b[0], b[1], m_indices, out)
    return out


def m_grouped_fp8_gemm_nt_contiguous_psum(a: _Pair, b: _Pair, out: torch.Tensor, psum: torch.Tensor, *,
                                          validate: bool = False) -> torch.Tensor:
    if not compiling():
        return api.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, psum, validate=validate)
    if validate:
        refuse_validate_when_compiling("m_grouped_fp8_gemm_nt_contiguous_psum")
    a, b = traced_pairs("m_grouped_fp8_gemm_nt_contiguous_psum", a, b)
    torch.ops.deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum_out(a[0], a[1], b[0], b[1], psum, out)
    return out


def m_grouped_fp8_gemm_nt_masked(a: _Pair, b: _Pair, out: torch.Tensor, masked_m: torch.Tensor,
                                 expected_m: int, *, validate: bool = False) -> torch.Tensor:
    if not compiling():
        return api.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m, validate=validate)
    if validate:
        refuse_validate_when_compiling("m_grouped_fp8_gemm_nt_masked")
    a, b = traced_pairs("m_grouped_fp8_gemm_nt_masked", a, b)
    torch.ops.deepgemm.m_grouped_fp8_gemm_nt_masked_out(a[0], a[1], b[0], b[1], masked_m, expected_m, out)
    return out


m_grouped_fp8_gemm_nt_contiguous.__doc__ = api.m_grouped_fp8_gemm_nt_contiguous.__doc__
m_grouped_fp8_gemm_nt_contiguous_psum.__doc__ = api.m_grouped_fp8_gemm_nt_contiguous_psum.__doc__
m_grouped_fp8_gemm_nt_masked.__doc__ = api.m_grouped_fp8_gemm_nt_masked.__doc__
