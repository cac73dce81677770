"""K-grouped FP8 GEMM (MoE Wgrad) as custom ops: functional, `_out`, and in-place accumulation into `c`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from deepgemm.api import kgrouped as api
from deepgemm.ops.library import compiling, define, require_ranks, traced_ks, traced_pairs

_Pair = tuple[torch.Tensor, torch.Tensor]


def _new_out(a: torch.Tensor, b: torch.Tensor, ks: Sequence[int]) -> torch.Tensor:
    require_ranks("k_grouped_fp8_gemm_tn_contiguous", ("a[0]", a, 2), ("b[0]", b, 2))
    return torch.empty((len(ks), a.shape[0], b.shape[0]), dtype=torch.float32, device=a.device)


def _impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, ks: list[int],
          c: torch.Tensor | None = None) -> torch.Tensor:
    return api.k_grouped_fp8_gemm_tn_contiguous((a, sfa), (b, sfb), _new_out(a, b, ks), ks, c)


def _fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, ks: list[int],
          c: torch.Tensor | None = None) -> torch.Tensor:
    out = _new_out(a, b, ks)
    api.check_k_grouped((a, sfa), (b, sfb), out, ks, c)
    return out


def _out_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, ks: list[int],
              c: torch.Tensor | None, out: torch.Tensor) -> None:
    api.k_grouped_fp8_gemm_tn_contiguous((a, sfa), (b, sfb), out, ks, c)


def _out_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, ks: list[int],
              c: torch.Tensor | None, out: torch.Tensor) -> None:
    api.check_k_grouped((a, sfa), (b, sfb), out, ks, c)


def _accumulate_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, ks: list[int],
                     c: torch.Tensor) -> None:
    api.k_grouped_fp8_gemm_tn_contiguous((a, sfa), (b, sfb), c, ks, c)


def _accumulate_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, ks: list[int],
                     c: torch.Tensor) -> None:
    api.check_k_grouped((a, sfa), (b, sfb), c, ks, c)


define("k_grouped_fp8_gemm_tn_contiguous(Tensor a, Tensor sfa, Tensor b, Tensor sfb, int[] ks, Tensor? c=None) "
       "-> Tensor", _impl, _fake)
define("k_grouped_fp8_gemm_tn_contiguous_out(Tensor a, Tensor sfa, Tensor b, Tensor sfb, int[] ks, Tensor? c, "
       "Tensor(a!) out) -> ()", _out_impl, _out_fake)
define("k_grouped_fp8_gemm_tn_contiguous_accumulate(Tensor a, Tensor sfa, Tensor b, Tensor sfb, int[] ks, "
       "Tensor(a!) c) -> ()", _accumulate_impl, _accumulate_fake)


def k_grouped_fp8_gemm_tn_contiguous(a: _Pair, b: _Pair, out: torch.Tensor, ks: Sequence[int] | torch.Tensor,
                                     c: torch.Tensor | None = None) -> torch.Tensor:
    if not compiling():
        return api.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks, c)
    # Traced: ks must be host ints (each distinct ks is a separate graph, as each is a separate offsets upload).
    a, b = traced_pairs("k_grouped_fp8_gemm_tn_contiguous", a, b)
    sizes = traced_ks("k_grouped_fp8_gemm_tn_contiguous", ks)
    if c is out:
        torch.ops.deepgemm.k_grouped_fp8_gemm_tn_contiguous_accumulate(a[0], a[1], b[0], b[1], sizes, out)
    else:
        torch.ops.deepgemm.k_grouped_fp8_gemm_tn_contiguous_out(a[0], a[1], b[0], b[1], sizes, c, out)
    return out


k_grouped_fp8_gemm_tn_contiguous.__doc__ = api.k_grouped_fp8_gemm_tn_contiguous.__doc__
