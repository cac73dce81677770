"""FP8 GEMM with DeepSeek-V3 fine-grained scaling: D = (A * sfa) @ (B * sfb)^T."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from deepgemm.api.backend import backend_for
from deepgemm.api.layout import to_mn_major_tma_aligned
from deepgemm.api.ready_launches import remember
from deepgemm.api.validation import (
    require_aligned,
    require_dtype,
    require_k_multiple_of_16,
    require_no_overlap,
    require_no_self_overlap,
    require_pair,
    require_rank,
    require_same_device,
    require_shape,
    require_row_count,
    require_tensor,
    require_tma_strides,
    refuse_grad,
)
from deepgemm.jit.resources import PtxasResources
from deepgemm.kernels.common.device import DEFAULT_NUM_SMS, device_name, planning_sm_count, sm_count
from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig
from deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics import choose_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan
from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmProblem
from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec
from deepgemm.reference import fp8_gemm_nt_reference
from deepgemm.tuning.db import tuning_db
from deepgemm.tuning.tuner import tune_fp8_gemm_nt
from deepgemm.utils import align_up, ceil_div

_WHERE = "fp8_gemm_nt"
FP8 = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float32)


_ELEMS_PER_16B = {torch.bfloat16: 8, torch.float32: 4}  # of OUT_DTYPES (a lookup: a 0-d tensor costs ~2-3 us)


def allocate_out(m: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[m, n] output whose rows are 16-byte aligned (a narrowed view when n is not a multiple of 16 bytes)."""
    padded = align_up(max(n, 1), _ELEMS_PER_16B[dtype])
    storage = torch.empty((m, padded), dtype=dtype, device=device)
    return storage if padded == n else storage[:, :n]


_grad_enabled = torch.is_grad_enabled
_ready: dict[tuple, tuple] = {}  # deepgemm.api.ready_launches: metadata key -> (plan, packed kernel arguments)


def _metadata_key(a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor,
                  out: torch.Tensor) -> tuple:
    # Data pointers are unique across devices and host memory (unified addressing), so they also pin
    # each tensor's device: the key reads no device (one attribute read costs ~0.1-0.2 us on this path).
    return (a_q.data_ptr(), a_q.shape, a_q.stride(), a_q.dtype, sfa.data_ptr(), sfa.shape, sfa.stride(), sfa.dtype,
            b_q.data_ptr(), b_q.shape, b_q.stride(), b_q.dtype, sfb.data_ptr(), sfb.shape, sfb.stride(), sfb.dtype,
            out.data_ptr(), out.shape, out.stride(), out.dtype)


def fp8_gemm_nt(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """D[M, N] = (A * sfa) @ (B * sfb)^T with FP32 accumulation promoted every 128 K.

    a = (A e4m3 [M, K], sfa float32 [M, ceil(K/128)]): one scale per row and 128 columns, in any
        layout (an M-major, 16-byte aligned one, as quantize_per_token_group returns, is used as is).
    b = (B e4m3 [N, K], sfb float32 [ceil(N/128), ceil(K/128)]): one scale per 128x128 block.
    out: optional [M, N] bfloat16/float32 tensor to write; else one of `out_dtype` (default bfloat16).
    K must be a multiple of 16 (TMA rows are 16-byte aligned). On CPU tensors or GPUs other than
    sm_90 the same result comes from the reference path (dequantize + float32 matmul).
    """
    if type(a) is tuple and type(b) is tuple and len(a) == 2 and len(b) == 2:
        # Fast path: an argument set (pointers, shapes, strides, dtypes) that already passed validation
        # launches with one dictionary lookup. Anything unusual falls through to the checked path.
        try:
            if out is None:
                dtype = torch.bfloat16 if out_dtype is None else out_dtype
                if dtype in OUT_DTYPES and a[0].dim() == 2 and b[0].dim() == 2:
                    out, out_dtype = allocate_out(a[0].shape[0], b[0].shape[0], dtype, a[0].device), None
            ready = _ready.get(_metadata_key(a[0], a[1], b[0], b[1], out)) if out is not None and out_dtype is None else None
        except (AttributeError, TypeError, RuntimeError):
            ready = None
        if ready is not None and out is not None and not (_grad_enabled() and (
                a[0].requires_grad or a[1].requires_grad or b[0].requires_grad or b[1].requires_grad
                or out.requires_grad)):
            ready[0].launch_packed(ready[1])
            return out
    return _fp8_gemm_nt_checked(a, b, out, out_dtype)


def check_fp8_gemm_nt(a: object, b: object, out: torch.Tensor | None, out_dtype: torch.dtype | None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype, torch.device]:
    """Every rule that needs only metadata (types, dtypes, shapes, devices, grad): shared by the eager path and the
    custom op's fake kernel. Returns (A, sfa, B, sfb, output dtype, device)."""
    a_q, sfa = require_pair(a, "a", _WHERE)
    b_q, sfb = require_pair(b, "b", _WHERE)
    require_dtype(a_q, "a[0]", _WHERE, (FP8,))
    require_dtype(b_q, "b[0]", _WHERE, (FP8,))
    require_rank(a_q, "a[0]", _WHERE, 2)
    require_rank(b_q, "b[0]", _WHERE, 2)
    m, k = a_q.shape
    n, k_b = b_q.shape
    if k_b != k:
        raise ValueError(f"{_WHERE}: 'a[0]' is [M={m}, K={k}] but 'b[0]' is [N={n}, K={k_b}]; K must match")
    require_dtype(sfa, "a[1]", _WHERE, (torch.float32,))
    require_dtype(sfb, "b[1]", _WHERE, (torch.float32,))
    k_groups = ceil_div(k, 128)
    require_shape(sfa, "a[1]", _WHERE, (m, k_groups), "one scale per row and 128 K: [M, ceil(K/128)]")
    require_shape(sfb, "b[1]", _WHERE, (ceil_div(n, 128), k_groups), "one scale per 128x128 block: [ceil(N/128), ceil(K/128)]")
    if out is not None:
        require_tensor(out, "out", _WHERE)
        require_dtype(out, "out", _WHERE, OUT_DTYPES)
        require_shape(out, "out", _WHERE, (m, n), "[M, N]")
        if out_dtype is not None and out_dtype != out.dtype:
            raise ValueError(f"{_WHERE}: 'out_dtype' is {out_dtype} but 'out' has dtype {out.dtype}")
        device = require_same_device(_WHERE, a=a_q, sfa=sfa, b=b_q, sfb=sfb, out=out)
        dtype = out.dtype
    else:
        dtype = torch.bfloat16 if out_dtype is None else out_dtype
        if dtype not in OUT_DTYPES:
            raise TypeError(f"{_WHERE}: 'out_dtype' must be torch.bfloat16 or torch.float32, got {dtype}")
        device = require_same_device(_WHERE, a=a_q, sfa=sfa, b=b_q, sfb=sfb)
    # The kernel's layout rules, on every path (the reference path could take more, the kernel cannot).
    require_k_multiple_of_16(k, "a[0]", _WHERE)
    require_tma_strides(a_q, "a[0]", _WHERE)
    require_tma_strides(b_q, "b[0]", _WHERE)
    if out is not None:
        require_tma_strides(out, "out", _WHERE)
        require_no_self_overlap(out, "out", _WHERE)
    require_row_count(m, "'a[0]' (M)", _WHERE)
    require_row_count(n, "'b[0]' (N)", _WHERE)
    refuse_grad(_WHERE, **{"a[0]": a_q, "a[1]": sfa, "b[0]": b_q, "b[1]": sfb, "out": out})
    return a_q, sfa, b_q, sfb, dtype, device


def check_fp8_gemm_nt_memory(a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor,
                             out: torch.Tensor | None) -> None:
    """The rules that read data pointers (eager calls only; fake tensors have no storage): A, B and a given `out`
    start 16-byte aligned, and `out` shares no memory with an operand."""
    require_aligned(a_q, "a[0]", _WHERE)
    require_aligned(b_q, "b[0]", _WHERE)
    if out is not None:
        require_aligned(out, "out", _WHERE)
        require_no_overlap(_WHERE, "out", out, (("a[0]", a_q), ("a[1]", sfa), ("b[0]", b_q), ("b[1]", sfb)))


def _fp8_gemm_nt_checked(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
                         out: torch.Tensor | None, out_dtype: torch.dtype | None) -> torch.Tensor:
    """The full path: validate everything, normalize layouts, plan, launch, and remember the result."""
    a_q, sfa, b_q, sfb, dtype, device = check_fp8_gemm_nt(a, b, out, out_dtype)
    check_fp8_gemm_nt_memory(a_q, sfa, b_q, sfb, out)
    (m, k), n = a_q.shape, b_q.shape[0]
    if out is None:
        out = allocate_out(m, n, dtype, device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if backend_for(a_q) == "reference":
        out.copy_(fp8_gemm_nt_reference(a_q, sfa, b_q, sfb))
        return out

    plan = get_plan(device.index, m, n, k, out.dtype, tuned_config(device.index, m, n, k, out.dtype))
    sfa_tma = to_mn_major_tma_aligned(sfa)
    sfb_rows = sfb.contiguous()
    args = plan.packed_args(a_q, sfa_tma, b_q, sfb_rows, out)
    plan.launch_packed(args)
    if sfa_tma is sfa and sfb_rows is sfb and out_dtype is None:
        remember(_ready, _metadata_key(a_q, sfa, b_q, sfb, out), plan, args)
    return out


@dataclass(frozen=True)
class PrecompileInfo:
    """What `precompile_fp8_gemm_nt` built: the config, ptxas resources and compile time."""

    label: str
    config: GemmConfig
    resources: PtxasResources | None
    compile_seconds: float
    cubin_path: str


def precompile_fp8_gemm_nt(
    m: int, n: int, k: int, *, out_dtype: torch.dtype = torch.bfloat16, num_sms: int | None = None
) -> PrecompileInfo:
    """Compile (into the disk cache) the kernel fp8_gemm_nt would use for this shape; no GPU needed.

    num_sms defaults to the current GPU's SM count, or 132 (H100/H200 SXM) without a GPU; given, it must be an int
    from 1 to that GPU's SM count (without a GPU: to 132, the largest Hopper part).
    """
    where = "precompile_fp8_gemm_nt"
    for name, value in (("m", m), ("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}: '{name}' must be a positive int, got {value!r}")
    if k % 16 != 0:
        raise ValueError(f"{where}: 'k' is K={k}; it must be a multiple of 16")
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in OUT_DTYPES:
        raise TypeError(f"{where}: 'out_dtype' must be torch.bfloat16 or torch.float32, got {out_dtype}")
    if num_sms is not None:
        if isinstance(num_sms, bool) or not isinstance(num_sms, int):
            raise TypeError(f"{where}: 'num_sms' must be an int (SMs to plan for), got {type(num_sms).__name__}")
        most = _physical_sm_count()
        if not 1 <= num_sms <= most:
            raise ValueError(f"{where}: 'num_sms' must be from 1 to {most} (the "
                             f"{'GPU' if torch.cuda.is_available() else 'largest Hopper part'}'s SM count), got {num_sms}")
    gpu_name = device_name(torch.cuda.current_device()) if torch.cuda.is_available() else None
    spec = planned_spec(m, n, k, out_dtype, planning_sm_count() if num_sms is None else num_sms, gpu_name)
    start = time.perf_counter()
    compiled = compile_spec(spec)
    return PrecompileInfo(
        label=spec.label(),
        config=spec.config,
        resources=compiled.resources,
        compile_seconds=time.perf_counter() - start,
        cubin_path=str(compiled.cubin_path),
    )


def _physical_sm_count() -> int:
    """The current GPU's SM count (before any DEEPGEMM_NUM_SMS cap), or DEFAULT_NUM_SMS without a GPU."""
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)
    return DEFAULT_NUM_SMS


def planned_spec(m: int, n: int, k: int, out_dtype: torch.dtype, num_sms: int, gpu_name: str | None = None) -> Fp8GemmSpec:
    """The instantiation a dense shape uses: the tuned choice for this GPU model where one is recorded, else the
    cost model's."""
    problem = GemmProblem(m, n, k, num_sms, out_dtype)
    config = tuning_db(gpu_name).lookup_problem(problem) if gpu_name is not None else None
    return Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=choose_config(problem) if config is None else config)


_tuned: dict[tuple[int, int, int, int, torch.dtype], GemmConfig | None] = {}
_TUNED_CAPACITY = 4096


def tuned_config(device_index: int, m: int, n: int, k: int, out_dtype: torch.dtype) -> GemmConfig | None:
    """The measured config for this shape's M bucket on this GPU model, or None (the plan then asks the cost model);
    looked up once per shape. DEEPGEMM_AUTOTUNE=1: an untuned bucket is measured first and recorded."""
    key = (device_index, m, n, k, out_dtype)
    if key in _tuned:
        return _tuned[key]
    problem = GemmProblem(m, n, k, sm_count(device_index), out_dtype)
    db = tuning_db(device_name(device_index))
    config = db.lookup_problem(problem)
    if config is None and os.environ.get("DEEPGEMM_AUTOTUNE") == "1":
        tune_fp8_gemm_nt(m, n, k, out_dtype=out_dtype, device=device_index)
        config = db.lookup_problem(problem)
    if len(_tuned) >= _TUNED_CAPACITY:
        _tuned.clear()
    _tuned[key] = config
    return config
