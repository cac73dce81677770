"""Dense FP8 GEMM as custom ops: `fp8_gemm_nt` (functional) and `fp8_gemm_nt_out`."""

from __future__ import annotations

import torch

from deepgemm.api import gemm as api
from deepgemm.ops.library import compiling, define, traced_pairs


def _impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
          out_dtype: torch.dtype | None = None, num_sms: int | None = None) -> torch.Tensor:
    return api.fp8_gemm_nt((a, sfa), (b, sfb), out_dtype=out_dtype, num_sms=num_sms)


def _fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
          out_dtype: torch.dtype | None = None, num_sms: int | None = None) -> torch.Tensor:
    _, _, _, _, dtype, device = api.check_fp8_gemm_nt((a, sfa), (b, sfb), None, out_dtype, num_sms)
    return api.allocate_out(a.shape[0], b.shape[0], dtype, device)


def _out_impl(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor,
              num_sms: int | None = None) -> None:
    api.fp8_gemm_nt((a, sfa), (b, sfb), out, num_sms=num_sms)


def _out_fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor,
              num_sms: int | None = None) -> None:
    api.check_fp8_gemm_nt((a, sfa), (b, sfb), out, None, num_sms)


# num_sms: appended with a default, so calls written before it keep working (positionally or by keyword).
define("fp8_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb, ScalarType? out_dtype=None, int? num_sms=None) "
       "-> Tensor", _impl, _fake)
define("fp8_gemm_nt_out(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) out, int? num_sms=None) -> ()",
       _out_impl, _out_fake)


def fp8_gemm_nt(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    num_sms: int | None = None,
) -> torch.Tensor:
    if not compiling():
        return api.fp8_gemm_nt(a, b, out, out_dtype=out_dtype, num_sms=num_sms)
    if isinstance(num_sms, bool):  # refused as eagerly: the op's `int?` would take it as 0 or 1
        api.check_num_sms(num_sms, "fp8_gemm_nt")
    a, b = traced_pairs("fp8_gemm_nt", a, b)
    if out is None:
        return torch.ops.deepgemm.fp8_gemm_nt(a[0], a[1], b[0], b[1], out_dtype, num_sms)
    if out_dtype is not None and out_dtype != out.dtype:
        raise ValueError(f"fp8_gemm_nt: 'out_dtype' is {out_dtype} but 'out' has dtype {out.dtype}")
    torch.ops.deepgemm.fp8_gemm_nt_out(a[0], a[1], b[0], b[1], out, num_sms)
    return out


fp8_gemm_nt.__doc__ = api.fp8_gemm_nt.__doc__
