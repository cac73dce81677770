"""BF16 GEMM in every layout: D = C + A @ B^T with FP32 accumulation, BF16 or FP32 out (no autograd here: the
differentiable public functions in deepgemm.ops wrap these)."""

from __future__ import annotations

import time
from typing import Any

import torch

from deepgemm.api.backend import backend_for
from deepgemm.api.gemm import FreshOutputs, PrecompileInfo, allocate_out, check_num_sms, planning_gpu_name
from deepgemm.api.layout import tma_rows
from deepgemm.api.tuned import TunedLookups
from deepgemm.api.ready_launches import keep, remember
from deepgemm.api.validation import (
    refuse_grad_for,
    require_aligned,
    require_dtype,
    require_no_overlap,
    require_output,
    require_rank,
    require_row_count,
    require_same_device,
    require_shape,
    require_tensor,
    require_tma_strides,
)
from deepgemm.jit.compiler import compile_kernel_outcome
from deepgemm.kernels.common.device import device_name, planning_sm_count, sm_count
from deepgemm.kernels.sm90_bf16_gemm.config import Bf16GemmConfig
from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16GemmPlan, bf16_problem, bf16_spec, get_bf16_plan
from deepgemm.kernels.sm90_bf16_gemm.spec import LAYOUTS, render_source
from deepgemm.reference import bf16_gemm_reference
from deepgemm.tuning.bf16_tuner import tune_bf16_gemm
from deepgemm.tuning.db import tuning_db

OUT_DTYPES = (torch.bfloat16, torch.float32)
_grad_enabled = torch.is_grad_enabled
_ready: dict[tuple, tuple] = {}  # deepgemm.api.ready_launches: metadata key -> (plan, packed kernel arguments)
_fresh: dict[tuple, FreshOutputs] = {}  # calls without `out`: operand key (+ out_dtype) -> launch state

# What each layout's operands look like: A as [M, K] or [K, M], B as [N, K] or [K, N].
_A_FORM = {"n": "[M, K]", "t": "[K, M]"}
_OUT_FORMS_NOT_DIFFERENTIABLE = ("the out= and in-place forms are not differentiable; pass out=None (the functional "
                                 "form has a backward), or call under torch.no_grad()")
_B_FORM = {"t": "[N, K]", "n": "[K, N]"}


def _metadata_key(layout: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None) -> tuple:
    return (layout, a.data_ptr(), a.shape, a.stride(), a.dtype, b.data_ptr(), b.shape, b.stride(), b.dtype,
            out.data_ptr(), out.shape, out.stride(), out.dtype,
            None if c is None else (c.data_ptr(), c.shape, c.stride(), c.dtype))


def _fresh_key(layout: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, out_dtype: torch.dtype | None
               ) -> tuple:
    return (layout, a.data_ptr(), a.shape, a.stride(), a.dtype, b.data_ptr(), b.shape, b.stride(), b.dtype,
            None if c is None else (c.data_ptr(), c.shape, c.stride(), c.dtype), out_dtype)


def _pack(plan: Bf16GemmPlan, operands: tuple, out: torch.Tensor) -> Any:
    a, b, c = operands
    return plan.packed_args(a, b, out, c)


def problem_shape(layout: str, a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int, int]:
    """(M, N, K, B's K) of a call in `layout` (A's K and B's K must agree)."""
    m, k = (a.shape[0], a.shape[1]) if layout[0] == "n" else (a.shape[1], a.shape[0])
    n, k_b = (b.shape[0], b.shape[1]) if layout[1] == "t" else (b.shape[1], b.shape[0])
    return m, n, k, k_b


def check_bf16_gemm(layout: str, a: object, b: object, out: torch.Tensor | None, c: torch.Tensor | None,
                    out_dtype: torch.dtype | None, *, differentiable: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.dtype, torch.device]:
    """Every rule that needs only metadata (shared by the eager path and the custom ops' fake kernels).
    `differentiable`: the functional op, whose autograd formula owns the inputs' gradients, asks; other paths refuse
    inputs that require grad. Returns (A, B, output dtype, device)."""
    if layout not in LAYOUTS:
        raise ValueError(f"bf16_gemm: 'layout' must be one of {LAYOUTS}, got {layout!r}")
    where = f"bf16_gemm_{layout}"
    a_t = require_tensor(a, "a", where)
    b_t = require_tensor(b, "b", where)
    require_dtype(a_t, "a", where, (torch.bfloat16,))
    require_dtype(b_t, "b", where, (torch.bfloat16,))
    require_rank(a_t, "a", where, 2)
    require_rank(b_t, "b", where, 2)
    m, n, k, k_b = problem_shape(layout, a_t, b_t)
    if k != k_b:
        raise ValueError(f"{where}: 'a' is {_A_FORM[layout[0]]} = {list(a_t.shape)} and 'b' is {_B_FORM[layout[1]]} = "
                         f"{list(b_t.shape)}: K must match (got {k} and {k_b})")
    tensors: dict[str, torch.Tensor] = {"a": a_t, "b": b_t}
    if c is not None:
        require_tensor(c, "c", where)
        require_dtype(c, "c", where, OUT_DTYPES)
        require_shape(c, "c", where, (m, n), "[M, N]")
        tensors["c"] = c
    if out is not None:
        require_tensor(out, "out", where)
        require_dtype(out, "out", where, OUT_DTYPES)
        require_shape(out, "out", where, (m, n), "[M, N]")
        if out_dtype is not None and out_dtype != out.dtype:
            raise ValueError(f"{where}: 'out_dtype' is {out_dtype} but 'out' has dtype {out.dtype}")
        tensors["out"] = out
        dtype = out.dtype
    else:
        dtype = out_dtype if out_dtype is not None else (c.dtype if c is not None else torch.bfloat16)
        if dtype not in OUT_DTYPES:
            raise TypeError(f"{where}: 'out_dtype' must be torch.bfloat16 or torch.float32, got {dtype}")
    device = require_same_device(where, **tensors)
    # The kernel's layout rules, on every path.
    if n % 8 != 0:
        raise ValueError(f"{where}: N={n} (from 'b' {_B_FORM[layout[1]]} = {list(b_t.shape)}) must be a multiple of 8: "
                         "the output's rows are written in 16-byte TMA units")
    require_tma_strides(a_t, "a", where)
    require_tma_strides(b_t, "b", where)
    for name in ("c", "out"):
        if name in tensors:
            require_tma_strides(tensors[name], name, where)
    if c is not None and c.shape[0] > 1 and c.stride(0) >= 2**32:
        raise ValueError(f"{where}: 'c' row stride is {c.stride(0)} elements; the kernel indexes C rows with a 32-bit "
                         "stride (must be below 2^32 elements)")
    if out is not None:
        require_output(out, "out", where)
    require_row_count(m, "'a' (M)", where)
    require_row_count(n, "'b' (N)", where)
    require_row_count(k, "'a' (K)", where)
    if not differentiable:
        refuse_grad_for(where, _OUT_FORMS_NOT_DIFFERENTIABLE, {"a": a_t, "b": b_t, "c": c, "out": out})
    return a_t, b_t, dtype, device


def check_bf16_gemm_memory(layout: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None,
                           c: torch.Tensor | None) -> None:
    """The rules that read data pointers (eager calls): 16-byte aligned bases; `out` shares no memory with A or B,
    and with C only as C itself (the in-place form)."""
    where = f"bf16_gemm_{layout}"
    require_aligned(a, "a", where)
    require_aligned(b, "b", where)
    if c is not None:
        require_aligned(c, "c", where)
    if out is not None:
        require_aligned(out, "out", where)
        same = c is not None and c.data_ptr() == out.data_ptr() and c.stride() == out.stride() and c.dtype == out.dtype
        require_no_overlap(where, "out", out, (("a", a), ("b", b), ("c", None if same else c)))


def bf16_gemm(layout: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
              c: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """D = C + A @ B^T in `layout`; see deepgemm.bf16_gemm_nt for the arguments."""
    # Fast path: an argument set (pointers, shapes, strides, dtypes) that passed validation before launches with one
    # dictionary lookup: keyed on the operands when the output is allocated here (FreshOutputs), on every tensor when
    # it is given. Anything unusual falls through to the checked path.
    fresh = ready = None
    try:
        if out is None:
            fresh = _fresh.get(_fresh_key(layout, a, b, c, out_dtype))
        elif out_dtype is None:
            ready = _ready.get(_metadata_key(layout, a, b, out, c))
    except (AttributeError, TypeError, RuntimeError, IndexError, KeyError):
        pass
    if (fresh is not None or ready is not None) and not (_grad_enabled() and (
            a.requires_grad or b.requires_grad or (c is not None and c.requires_grad)
            or (out is not None and out.requires_grad))):
        if fresh is not None:
            return fresh.run(a, b, c)
        if ready is not None and out is not None:
            ready[0].launch_packed(ready[1])
            return out
    return _bf16_gemm_checked(layout, a, b, out, c, out_dtype)


def _bf16_gemm_checked(layout: str, a: object, b: object, out: torch.Tensor | None, c: torch.Tensor | None,
                       out_dtype: torch.dtype | None) -> torch.Tensor:
    a_t, b_t, dtype, device = check_bf16_gemm(layout, a, b, out, c, out_dtype)
    check_bf16_gemm_memory(layout, a_t, b_t, out, c)
    m, n, k, _ = problem_shape(layout, a_t, b_t)
    # A broadcast operand (rows 0 bytes apart, e.g. x.expand(M, K)) is no TMA tensor: copied, on every path.
    a_rows, b_rows = tma_rows(a_t), tma_rows(b_t)
    copied = a_rows is not a_t or b_rows is not b_t
    a_t, b_t = a_rows, b_rows
    allocated = out is None
    if out is None:
        out = allocate_out(m, n, dtype, device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.copy_(c) if c is not None else out.zero_()
    if backend_for(a_t) == "reference":
        out.copy_(bf16_gemm_reference(a_t, b_t, layout, c))
        return out
    c_dtype = None if c is None else c.dtype
    config = tuned_bf16_config(device.index, m, n, k, layout, out.dtype, c_dtype)
    plan = get_bf16_plan(device.index, m, n, k, layout, out.dtype, c_dtype, config)
    args = plan.packed_args(a_t, b_t, out, c)
    plan.launch_packed(args)
    if not copied:  # (ready_launches: only the caller's own pointers are remembered)
        if allocated:
            keep(_fresh, _fresh_key(layout, a_t, b_t, c, out_dtype), FreshOutputs(plan, _pack, out, args))
        elif out_dtype is None:
            remember(_ready, _metadata_key(layout, a_t, b_t, out, c), plan, args)
    return out


_tuned: TunedLookups[Bf16GemmConfig] = TunedLookups()


def tuned_bf16_config(device_index: int, m: int, n: int, k: int, layout: str, out_dtype: torch.dtype,
                      c_dtype: torch.dtype | None) -> Bf16GemmConfig | None:
    """The measured tile for this shape's M bucket on this GPU model, or None (the plan then asks the cost model);
    looked up once per shape. DEEPGEMM_AUTOTUNE=1: an untuned bucket is measured first and recorded."""
    problem = bf16_problem(m, n, k, layout, out_dtype, c_dtype, sm_count(device_index))
    return _tuned.get((device_index, m, n, k, layout, out_dtype, c_dtype),
                      lambda: tuning_db(device_name(device_index)).lookup_bf16(problem),
                      lambda: tune_bf16_gemm(layout, m, n, k, out_dtype=out_dtype, c_dtype=c_dtype, device=device_index))


def precompile_bf16_gemm(layout: str, m: int, n: int, k: int, *, out_dtype: torch.dtype = torch.bfloat16,
                         c_dtype: torch.dtype | None = None, num_sms: int | None = None,
                         gpu: str | None = None) -> PrecompileInfo:
    """Compile (into the disk cache) the kernel bf16_gemm_<layout> loads for an M x N x K call; no GPU needed.

    `out_dtype` / `c_dtype` (None: no C) are the output's and the addend's dtypes; `num_sms` the SMs to plan for
    (default: the current GPU's, or 132 without one, either capped by DEEPGEMM_NUM_SMS); `gpu` the GPU model whose
    tuned table picks the tile (as precompile_fp8_gemm_nt's). Raises ValueError for a layout, size, N or SM count
    no call can have, TypeError for a dtype (or a non-int SM count) no call can have."""
    check_precompile_bf16_shape(layout, m, n, k, out_dtype=out_dtype, c_dtype=c_dtype, num_sms=num_sms)
    sms = planning_sm_count() if num_sms is None else num_sms
    gpu_name = planning_gpu_name(gpu, f"precompile_bf16_gemm_{layout}")
    tuned = None
    if gpu_name is not None:  # the tuned choice a call on that GPU model would load
        tuned = tuning_db(gpu_name).lookup_bf16(bf16_problem(m, n, k, layout, out_dtype, c_dtype, sms))
    spec = bf16_spec(m, n, k, layout, out_dtype, c_dtype, sms, tuned)
    start = time.perf_counter()
    compiled, outcome = compile_kernel_outcome(render_source(spec))
    return PrecompileInfo(label=spec.label(), config=spec.config, resources=compiled.resources,
                          compile_seconds=time.perf_counter() - start, cubin_path=str(compiled.cubin_path),
                          cached=outcome != "compiled")


def check_precompile_bf16_shape(layout: str, m: int, n: int, k: int, *, out_dtype: torch.dtype = torch.bfloat16,
                                c_dtype: torch.dtype | None = None, num_sms: int | None = None) -> None:
    """precompile_bf16_gemm's argument rules, without planning or compiling (a shape no call can have raises)."""
    where = f"precompile_bf16_gemm_{layout}"
    if layout not in LAYOUTS:
        raise ValueError(f"precompile_bf16_gemm: 'layout' must be one of {LAYOUTS}, got {layout!r}")
    for name, value in (("m", m), ("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}: '{name}' must be a positive int, got {value!r}")
    check_num_sms(num_sms, where)  # fp8_gemm_nt's rule: an int from 1 to the GPU's (or the largest Hopper's) SM count
    if n % 8 != 0:
        raise ValueError(f"{where}: N={n} must be a multiple of 8: the output's rows are written in 16-byte TMA units")
    for name, dtype in (("out_dtype", out_dtype), ("c_dtype", c_dtype)):
        if dtype is not None and dtype not in OUT_DTYPES:
            raise TypeError(f"{where}: '{name}' must be torch.bfloat16 or torch.float32, got {dtype}")
