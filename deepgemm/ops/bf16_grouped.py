"""MoE grouped BF16 GEMMs as custom ops: contiguous (m_indices or psum) and masked (functional and `_out`), k-grouped
(functional, `_out`, in-place accumulation into `c`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from deepgemm.api import bf16_grouped as api
from deepgemm.ops.library import (compiling, define, empty_out, refuse_validate_when_compiling, require_ranks,
                                   traced_ks)


def _contiguous_shape(where: str, a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    require_ranks(where, ("a", a, 2), ("b", b, 3))
    return a.shape[0], b.shape[1]


def _masked_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    require_ranks("m_grouped_bf16_gemm_nt_masked", ("a", a, 3), ("b", b, 3))
    return a.shape[0], a.shape[1], b.shape[1]


def _define_contiguous(name: str, grouping_name: str, run: Callable[..., torch.Tensor], psum_form: bool) -> None:
    def impl(a: torch.Tensor, b: torch.Tensor, grouping: torch.Tensor, out_dtype: torch.dtype | None = None
             ) -> torch.Tensor:
        return run(a, b, empty_out(_contiguous_shape(name, a, b), out_dtype, a), grouping)

    def fake(a: torch.Tensor, b: torch.Tensor, grouping: torch.Tensor, out_dtype: torch.dtype | None = None
             ) -> torch.Tensor:
        out = empty_out(_contiguous_shape(name, a, b), out_dtype, a)
        api.check_bf16_contiguous(a, b, out, grouping, psum_form=psum_form)
        return out

    def out_impl(a: torch.Tensor, b: torch.Tensor, grouping: torch.Tensor, out: torch.Tensor) -> None:
        run(a, b, out, grouping)

    def out_fake(a: torch.Tensor, b: torch.Tensor, grouping: torch.Tensor, out: torch.Tensor) -> None:
        api.check_bf16_contiguous(a, b, out, grouping, psum_form=psum_form)

    define(f"{name}(Tensor a, Tensor b, Tensor {grouping_name}, ScalarType? out_dtype=None) -> Tensor", impl, fake)
    define(f"{name}_out(Tensor a, Tensor b, Tensor {grouping_name}, Tensor(a!) out) -> ()", out_impl, out_fake)


_define_contiguous("m_grouped_bf16_gemm_nt_contiguous", "m_indices", api.m_grouped_bf16_gemm_nt_contiguous, False)
_define_contiguous("m_grouped_bf16_gemm_nt_contiguous_psum", "psum", api.m_grouped_bf16_gemm_nt_contiguous_psum, True)


def _masked_impl(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = empty_out(_masked_shape(a, b), out_dtype, a)
    api.m_grouped_bf16_gemm_nt_masked(a, b, out, masked_m, expected_m)
    # A functional result is fully defined: rows at or past masked_m[g] are zero (on the device: capturable).
    valid = torch.arange(out.shape[1], device=out.device)[None, :] < masked_m.to(out.device)[:, None]
    return out.masked_fill_(~valid[:, :, None], 0)


def _masked_fake(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = empty_out(_masked_shape(a, b), out_dtype, a)
    api.check_bf16_masked(a, b, out, masked_m, expected_m)
    return out


def _masked_out_impl(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                     out: torch.Tensor) -> None:
    api.m_grouped_bf16_gemm_nt_masked(a, b, out, masked_m, expected_m)


def _masked_out_fake(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                     out: torch.Tensor) -> None:
    api.check_bf16_masked(a, b, out, masked_m, expected_m)


define("m_grouped_bf16_gemm_nt_masked(Tensor a, Tensor b, Tensor masked_m, int expected_m, "
       "ScalarType? out_dtype=None) -> Tensor", _masked_impl, _masked_fake)
define("m_grouped_bf16_gemm_nt_masked_out(Tensor a, Tensor b, Tensor masked_m, int expected_m, Tensor(a!) out) -> ()",
       _masked_out_impl, _masked_out_fake)


def _k_out(a: torch.Tensor, b: torch.Tensor, ks: Sequence[int]) -> torch.Tensor:
    require_ranks("k_grouped_bf16_gemm_tn_contiguous", ("a", a, 2), ("b", b, 2))
    return torch.empty((len(ks), a.shape[1], b.shape[1]), dtype=torch.float32, device=a.device)


def _k_impl(a: torch.Tensor, b: torch.Tensor, ks: list[int], c: torch.Tensor | None = None) -> torch.Tensor:
    return api.k_grouped_bf16_gemm_tn_contiguous(a, b, _k_out(a, b, ks), ks, c)


def _k_fake(a: torch.Tensor, b: torch.Tensor, ks: list[int], c: torch.Tensor | None = None) -> torch.Tensor:
    out = _k_out(a, b, ks)
    api.check_bf16_k_grouped(a, b, out, ks, c)
    return out


def _k_out_impl(a: torch.Tensor, b: torch.Tensor, ks: list[int], c: torch.Tensor | None, out: torch.Tensor) -> None:
    api.k_grouped_bf16_gemm_tn_contiguous(a, b, out, ks, c)


def _k_out_fake(a: torch.Tensor, b: torch.Tensor, ks: list[int], c: torch.Tensor | None, out: torch.Tensor) -> None:
    api.check_bf16_k_grouped(a, b, out, ks, c)


def _k_accumulate_impl(a: torch.Tensor, b: torch.Tensor, ks: list[int], c: torch.Tensor) -> None:
    api.k_grouped_bf16_gemm_tn_contiguous(a, b, c, ks, c)


def _k_accumulate_fake(a: torch.Tensor, b: torch.Tensor, ks: list[int], c: torch.Tensor) -> None:
    api.check_bf16_k_grouped(a, b, c, ks, c)


define("k_grouped_bf16_gemm_tn_contiguous(Tensor a, Tensor b, int[] ks, Tensor? c=None) -> Tensor", _k_impl, _k_fake)
define("k_grouped_bf16_gemm_tn_contiguous_out(Tensor a, Tensor b, int[] ks, Tensor? c, Tensor(a!) out) -> ()",
       _k_out_impl, _k_out_fake)
define("k_grouped_bf16_gemm_tn_contiguous_accumulate(Tensor a, Tensor b, int[] ks, Tensor(a!) c) -> ()",
       _k_accumulate_impl, _k_accumulate_fake)


# ---- public functions ---------------------------------------------------------------------------------------



def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m_indices: torch.Tensor,
                                      *, validate: bool = False) -> torch.Tensor:
    if not compiling():
        return api.m_grouped_bf16_gemm_nt_contiguous(a, b, out, m_indices, validate=validate)
    if validate:
        refuse_validate_when_compiling("m_grouped_bf16_gemm_nt_contiguous")
    torch.ops.deepgemm.m_grouped_bf16_gemm_nt_contiguous_out(a, b, m_indices, out)
    return out


def m_grouped_bf16_gemm_nt_contiguous_psum(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, psum: torch.Tensor,
                                           *, validate: bool = False) -> torch.Tensor:
    if not compiling():
        return api.m_grouped_bf16_gemm_nt_contiguous_psum(a, b, out, psum, validate=validate)
    if validate:
        refuse_validate_when_compiling("m_grouped_bf16_gemm_nt_contiguous_psum")
    torch.ops.deepgemm.m_grouped_bf16_gemm_nt_contiguous_psum_out(a, b, psum, out)
    return out


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int, *, validate: bool = False) -> torch.Tensor:
    if not compiling():
        return api.m_grouped_bf16_gemm_nt_masked(a, b, out, masked_m, expected_m, validate=validate)
    if validate:
        refuse_validate_when_compiling("m_grouped_bf16_gemm_nt_masked")
    torch.ops.deepgemm.m_grouped_bf16_gemm_nt_masked_out(a, b, masked_m, expected_m, out)
    return out


def k_grouped_bf16_gemm_tn_contiguous(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                                      ks: Sequence[int] | torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
    if not compiling():
        return api.k_grouped_bf16_gemm_tn_contiguous(a, b, out, ks, c)
    sizes = traced_ks("k_grouped_bf16_gemm_tn_contiguous", ks)  # (each distinct ks is its own graph)
    if c is out:
        torch.ops.deepgemm.k_grouped_bf16_gemm_tn_contiguous_accumulate(a, b, sizes, out)
    else:
        torch.ops.deepgemm.k_grouped_bf16_gemm_tn_contiguous_out(a, b, sizes, c, out)
    return out


m_grouped_bf16_gemm_nt_contiguous.__doc__ = api.m_grouped_bf16_gemm_nt_contiguous.__doc__
m_grouped_bf16_gemm_nt_contiguous_psum.__doc__ = api.m_grouped_bf16_gemm_nt_contiguous_psum.__doc__
m_grouped_bf16_gemm_nt_masked.__doc__ = api.m_grouped_bf16_gemm_nt_masked.__doc__
k_grouped_bf16_gemm_tn_contiguous.__doc__ = api.k_grouped_bf16_gemm_tn_contiguous.__doc__
