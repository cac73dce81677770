"""FP8 GEMM with DeepSeek-V3 fine-grained scaling: D = (A * sfa) @ (B * sfb)^T."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from deepgemm.api.backend import backend_for
from deepgemm.api.layout import tma_rows, to_mn_major_tma_aligned
from deepgemm.api.tuned import TunedLookups
from deepgemm.api.ready_launches import keep, remember
from deepgemm.api.validation import (
    require_aligned,
    require_dtype,
    require_k_multiple_of_16,
    require_no_overlap,
    require_output,
    require_pair,
    require_rank,
    require_same_device,
    require_shape,
    require_row_count,
    require_tensor,
    require_tma_strides,
    refuse_grad,
)
from deepgemm.jit.compiler import compile_stats
from deepgemm.jit.resources import PtxasResources
from deepgemm.kernels.common.device import (DEFAULT_NUM_SMS, device_name, physical_sm_count, planning_sm_count,
                                            sm_count)
from deepgemm.kernels.sm90_bf16_gemm.config import Bf16GemmConfig
from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig
from deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics import choose_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Fp8GemmPlan, get_plan
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
    return empty_rows(m, align_up(max(n, 1), _ELEMS_PER_16B[dtype]), n, dtype, device)


def empty_rows(m: int, cols: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[m, n] over rows of `cols` elements (allocate_out's layout, its row length already known)."""
    storage = torch.empty(m, cols, dtype=dtype, device=device)  # (ints, not a tuple: ~1 us less to parse)
    return storage if cols == n else storage[:, :n]


def empty_rows_like(like: torch.Tensor, m: int, cols: int, n: int) -> torch.Tensor:
    """empty_rows with `like`'s dtype and device: launch-ready paths keep an empty tensor of the output's dtype
    and device, since `new_empty` parses two ints where torch.empty also parses dtype and device (~0.3 us)."""
    storage = like.new_empty(m, cols)
    return storage if cols == n else storage[:, :n]


_grad_enabled = torch.is_grad_enabled
_ready: dict[tuple, tuple] = {}  # deepgemm.api.ready_launches: metadata key -> (plan, packed kernel arguments)


def _metadata_key(a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor,
                  out: torch.Tensor, num_sms: int | None = None) -> tuple:
    # Data pointers are unique across devices and host memory (unified addressing), so they also pin
    # each tensor's device: the key reads no device (one attribute read costs ~0.1-0.2 us on this path).
    # The requested SM count is part of it: a call with another num_sms never launches this one's plan.
    return (a_q.data_ptr(), a_q.shape, a_q.stride(), a_q.dtype, sfa.data_ptr(), sfa.shape, sfa.stride(), sfa.dtype,
            b_q.data_ptr(), b_q.shape, b_q.stride(), b_q.dtype, sfb.data_ptr(), sfb.shape, sfb.stride(), sfb.dtype,
            out.data_ptr(), out.shape, out.stride(), out.dtype, num_sms)


def _fresh_key(a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor,
               out_dtype: torch.dtype | None, num_sms: int | None) -> tuple:
    return (a_q.data_ptr(), a_q.shape, a_q.stride(), a_q.dtype, sfa.data_ptr(), sfa.shape, sfa.stride(), sfa.dtype,
            b_q.data_ptr(), b_q.shape, b_q.stride(), b_q.dtype, sfb.data_ptr(), sfb.shape, sfb.stride(), sfb.dtype,
            out_dtype, num_sms)


class FreshOutputs:
    """Launch state of calls that allocate their output (each public GEMM keys its table on the operands): the
    output's size and the packed arguments per output pointer. `pack(plan, operands, out)` packs a new pointer's
    arguments (in the order the plan takes them)."""

    __slots__ = ("args", "cols", "like", "m", "n", "pack", "plan")
    _ARGS_CAPACITY = 16  # output pointers per entry (a steady state reuses one or two blocks)

    def __init__(self, plan: Any, pack: Callable[[Any, tuple, torch.Tensor], Any], out: torch.Tensor,
                 args: Any) -> None:
        self.plan, self.pack = plan, pack
        self.like = out.new_empty(0)  # the output's dtype and device (empty_rows_like)
        self.m, self.n = out.shape
        self.cols = out.stride(0)  # n, or n padded to 16 bytes
        self.args: dict[int, Any] = {out.data_ptr(): args}

    def run(self, *operands: torch.Tensor | None) -> torch.Tensor:
        out = empty_rows_like(self.like, self.m, self.cols, self.n)
        args = self.args.get(out.data_ptr())
        if args is None:
            if len(self.args) >= self._ARGS_CAPACITY:
                self.args.clear()
            args = self.args[out.data_ptr()] = self.pack(self.plan, operands, out)
        self.plan.launch_packed(args)
        return out


def _pack_fp8(plan: Fp8GemmPlan, operands: tuple, out: torch.Tensor) -> Any:
    a_q, sfa, b_q, sfb = operands
    return plan.packed_args(a_q, sfa, b_q, sfb, out)


_fresh: dict[tuple, FreshOutputs] = {}  # fp8_gemm_nt without `out`: operand key (+ out_dtype, num_sms) -> state


def ready_plan(a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor,
               out: torch.Tensor, num_sms: int | None = None) -> Fp8GemmPlan | None:
    """The plan a checked call remembered for exactly these tensors (metadata and pointers), or None: the
    launch-ready state another fast path (quantize + GEMM) may reuse for views of the same layout."""
    entry = _ready.get(_metadata_key(a_q, sfa, b_q, sfb, out, num_sms))
    return None if entry is None else entry[0]


def fp8_gemm_nt(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    num_sms: int | None = None,
) -> torch.Tensor:
    """D[M, N] = (A * sfa) @ (B * sfb)^T with FP32 accumulation promoted every 128 K, BF16 or FP32 out.

    On an sm_90 GPU our kernel runs; on CPU tensors or other GPUs the same result comes from the reference path
    (dequantize + float32 matmul), after the same argument checks. Any M >= 0; K a multiple of 16.

    Args:
        a = (A e4m3 [M, K], sfa float32 [M, ceil(K/128)]): A row-major (unit stride along K, rows a multiple of
            16 bytes apart, 16-byte aligned base); one scale per row and 128 columns, in any layout (the M-major,
            16-byte aligned one that quantize_per_token_group returns is read in place, others are copied).
        b = (B e4m3 [N, K], sfb float32 [ceil(N/128), ceil(K/128)]): B given as [N, K] with A's row rules; one
            scale per 128x128 block (row-major; another layout is copied).
        out: optional [M, N] bfloat16 or float32 tensor to write (A's row rules, no element stored twice, no
            memory shared with an operand); None: a new tensor of `out_dtype` is returned.
        out_dtype: the new output's dtype, torch.bfloat16 (None, the default) or torch.float32; with `out` it
            must be None or out.dtype.
        num_sms: the SMs this call's kernel may occupy, e.g. to leave the rest to a concurrent NCCL kernel: the
            persistent grid launches at most `num_sms` CTAs and the tile choice (tuned entry or cost model) is
            made for that many SMs. An int from 1 to the GPU's SM count (before any DEEPGEMM_NUM_SMS cap, which it
            replaces; on CPU or meta tensors, to 132). None (the default): the GPU's SM count, capped by
            DEEPGEMM_NUM_SMS. Each value has its own plan (and its own kernel where the tile choice differs);
            the result does not depend on it beyond FP32 summation order.

    Returns:
        `out`, or the new [M, N] tensor (a view of 16-byte aligned rows when N is not a multiple of 16 bytes).

    Raises:
        TypeError: `a` or `b` is not a pair of tensors, or a dtype is wrong (A, B not float8_e4m3fn, scales not
            float32, `out` or `out_dtype` not bfloat16/float32), or `num_sms` is neither None nor an int
            (a bool or a float such as 66.0 included).
        ValueError: a shape, device or layout rule is broken, on every path: A and B disagree on K, a scale
            tensor has the wrong shape, K % 16 != 0, rows not unit-stride or 16-byte aligned, tensors on two
            devices, `out` overlapping itself or an operand, `out_dtype` disagreeing with `out`, M or N past
            2^31 - 1, `num_sms` outside 1 to the SM count.
        deepgemm.NotDifferentiableError: an argument requires grad while grad mode is on.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError: the first call of a shape could not
            compile, cache or load its kernel (kernel path).
        deepgemm.GraphCaptureError: that first call happens while a CUDA graph is being captured.
        deepgemm.UnsupportedError: the planner finds no tile that fits shared memory (kernel path).

    Example::

        x = torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2112, 7168, device="cuda", dtype=torch.bfloat16)
        a = deepgemm.quantize_per_token_group(x)     # (e4m3 [4096, 7168], float32 [4096, 56] M-major)
        b = deepgemm.quantize_per_block(w)           # (e4m3 [2112, 7168], float32 [17, 56])
        y = deepgemm.fp8_gemm_nt(a, b)               # bfloat16 [4096, 2112]
        out = torch.empty(4096, 2112, device="cuda", dtype=torch.float32)
        deepgemm.fp8_gemm_nt(a, b, out)              # written into out
        y = deepgemm.fp8_gemm_nt(a, b, num_sms=112)  # at most 112 SMs: the rest stay free for a collective
    """
    # (`type(num_sms) is int` keeps True and 66.0, equal to 1 and 66 as keys, off the fast path: they are refused.)
    if (type(a) is tuple and type(b) is tuple and len(a) == 2 and len(b) == 2
            and (num_sms is None or type(num_sms) is int)):
        # Fast path: an argument set (pointers, shapes, strides, dtypes) that already passed validation
        # launches with one dictionary lookup. Anything unusual falls through to the checked path.
        fresh = ready = None
        try:  # (only the key and the lookup: an error of the launch itself must surface)
            if out is None:
                fresh = _fresh.get(_fresh_key(a[0], a[1], b[0], b[1], out_dtype, num_sms))
            elif out_dtype is None:
                ready = _ready.get(_metadata_key(a[0], a[1], b[0], b[1], out, num_sms))
        except (AttributeError, TypeError, RuntimeError):
            pass
        if fresh is not None and not (_grad_enabled() and (
                a[0].requires_grad or a[1].requires_grad or b[0].requires_grad or b[1].requires_grad)):
            return fresh.run(a[0], a[1], b[0], b[1])
        if ready is not None and out is not None and not (_grad_enabled() and (
                a[0].requires_grad or a[1].requires_grad or b[0].requires_grad or b[1].requires_grad
                or out.requires_grad)):
            ready[0].launch_packed(ready[1])
            return out
    return _fp8_gemm_nt_checked(a, b, out, out_dtype, num_sms)


def check_fp8_gemm_nt(a: object, b: object, out: torch.Tensor | None, out_dtype: torch.dtype | None,
                      num_sms: object = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype, torch.device]:
    """Every rule that needs only metadata (types, dtypes, shapes, devices, grad, the SM count): shared by the eager
    path and the custom op's fake kernel. Returns (A, sfa, B, sfb, output dtype, device)."""
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
        require_output(out, "out", _WHERE)
    require_row_count(m, "'a[0]' (M)", _WHERE)
    require_row_count(n, "'b[0]' (N)", _WHERE)
    require_row_count(k, "'a[0]' (K)", _WHERE)
    check_num_sms(num_sms, _WHERE, device)
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
                         out: torch.Tensor | None, out_dtype: torch.dtype | None,
                         num_sms: int | None = None) -> torch.Tensor:
    """The full path: validate everything, normalize layouts, plan, launch, and remember the result."""
    a_q, sfa, b_q, sfb, dtype, device = check_fp8_gemm_nt(a, b, out, out_dtype, num_sms)
    fresh = out is None
    num_sms = None if num_sms is None else int(num_sms)  # (an int subclass keys as the plain int)
    check_fp8_gemm_nt_memory(a_q, sfa, b_q, sfb, out)
    # A broadcast operand (rows 0 bytes apart) is no TMA tensor: copied, on every path.
    a_rows, b_rows = tma_rows(a_q), tma_rows(b_q)
    copied = a_rows is not a_q or b_rows is not b_q
    a_q, b_q = a_rows, b_rows
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

    config = tuned_config(device.index, m, n, k, out.dtype, num_sms)  # both: None = the device's (capped) SMs
    plan = get_plan(device.index, m, n, k, out.dtype, config, num_sms)
    sfa_tma = to_mn_major_tma_aligned(sfa)
    sfb_rows = sfb.contiguous()
    args = plan.packed_args(a_q, sfa_tma, b_q, sfb_rows, out)
    plan.launch_packed(args)
    if sfa_tma is sfa and sfb_rows is sfb and not copied:
        if fresh:
            keep(_fresh, _fresh_key(a_q, sfa, b_q, sfb, out_dtype, num_sms), FreshOutputs(plan, _pack_fp8, out, args))
        elif out_dtype is None:
            remember(_ready, _metadata_key(a_q, sfa, b_q, sfb, out, num_sms), plan, args)
    return out


@dataclass(frozen=True)
class PrecompileInfo:
    """What `precompile_fp8_gemm_nt` (a GemmConfig) or the BF16 precompile (a Bf16GemmConfig) built: the config,
    ptxas resources, the time the call took and whether the kernel came from a cache (the disk cache or this process's memo: nothing was compiled) rather than NVRTC (a
    compile that another thread of the process ran meanwhile counts as this call's)."""

    label: str
    config: GemmConfig | Bf16GemmConfig
    resources: PtxasResources | None
    compile_seconds: float
    cubin_path: str
    cached: bool = False


def precompile_fp8_gemm_nt(
    m: int, n: int, k: int, *, out_dtype: torch.dtype = torch.bfloat16, num_sms: int | None = None,
    gpu: str | None = None,
) -> PrecompileInfo:
    """Compile (into the disk cache) the kernel fp8_gemm_nt would use for this shape; no GPU needed.

    The plan is the one a call makes: the GPU model's tuned choice where one is recorded, else the cost model's.

    Args:
        m / n / k: the shape of A [m, k] x B [n, k]^T, positive ints, k a multiple of 16.
        out_dtype: torch.bfloat16 (default) or torch.float32.
        num_sms: the SMs to plan for; default the current GPU's SM count, or 132 (H100/H200 SXM) without a GPU,
            either capped by DEEPGEMM_NUM_SMS; given, an int from 1 to the GPU's SM count (without a GPU: to 132,
            the largest Hopper part).
        gpu: the GPU model to plan for, as torch.cuda.get_device_name() names it (e.g. "NVIDIA H200"), whose tuned
            table picks the tile; default the current GPU's, and without a GPU none (the cost model alone). A name
            with no tuned table plans with the cost model.

    Returns:
        A PrecompileInfo: `label`, `config` (the GemmConfig), `resources` (ptxas registers, spills), the
        `compile_seconds` and the `cubin_path`.

    Raises:
        ValueError: `m`, `n` or `k` is not a positive int, k % 16 != 0, or `num_sms` is out of range.
        TypeError: `out_dtype` is not bfloat16/float32, `num_sms` is not an int, or `gpu` is not a str.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError: compiling or caching failed.
        deepgemm.UnsupportedError: the planner finds no tile that fits shared memory.

    Example::

        info = deepgemm.precompile_fp8_gemm_nt(4096, 2112, 7168, out_dtype=torch.bfloat16)
        print(info.label, info.compile_seconds, info.cubin_path)
    """
    where = "precompile_fp8_gemm_nt"
    check_precompile_shape(m, n, k, out_dtype=out_dtype, num_sms=num_sms)
    gpu_name = planning_gpu_name(gpu, where)
    spec = planned_spec(m, n, k, out_dtype, planning_sm_count() if num_sms is None else num_sms, gpu_name)
    start, before = time.perf_counter(), compile_stats()
    compiled = compile_spec(spec)
    return PrecompileInfo(
        label=spec.label(),
        config=spec.config,
        resources=compiled.resources,
        compile_seconds=time.perf_counter() - start,
        cubin_path=str(compiled.cubin_path),
        cached=(compile_stats() - before).compiled == 0,  # exact unless other threads compile meanwhile
    )


def check_precompile_shape(m: int, n: int, k: int, *, out_dtype: torch.dtype = torch.bfloat16,
                           num_sms: int | None = None) -> None:
    """precompile_fp8_gemm_nt's argument rules, without planning or compiling (a shape no call can have raises)."""
    where = "precompile_fp8_gemm_nt"
    for name, value in (("m", m), ("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}: '{name}' must be a positive int, got {value!r}")
    if k % 16 != 0:
        raise ValueError(f"{where}: 'k' is K={k}; it must be a multiple of 16")
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in OUT_DTYPES:
        raise TypeError(f"{where}: 'out_dtype' must be torch.bfloat16 or torch.float32, got {out_dtype}")
    check_num_sms(num_sms, where)


def planning_gpu_name(gpu: object, where: str) -> str | None:
    """The GPU model a precompile plans for: `gpu` (a device name), else the current GPU's, else None."""
    if gpu is not None:
        if not isinstance(gpu, str):
            raise TypeError(f"{where}: 'gpu' must be a device name (str) or None, got {type(gpu).__name__}")
        return gpu
    return device_name(torch.cuda.current_device()) if torch.cuda.is_available() else None


def _physical_sm_count(device: torch.device | None = None) -> int:
    """The SM count (before any DEEPGEMM_NUM_SMS cap) of a CUDA `device`, or of the current GPU when `device` is
    None; DEFAULT_NUM_SMS (the largest Hopper part) for other devices and without a GPU."""
    if not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return DEFAULT_NUM_SMS
    return physical_sm_count(torch.cuda.current_device() if device is None or device.index is None else device.index)


def check_num_sms(num_sms: object, where: str, device: torch.device | None = None) -> None:
    """A per-call SM count: None, or an int (not a bool) from 1 to `_physical_sm_count(device)`."""
    if num_sms is None:
        return
    if isinstance(num_sms, bool) or not isinstance(num_sms, (int, torch.SymInt)):  # (SymInt: traced by Dynamo)
        raise TypeError(f"{where}: 'num_sms' must be an int (SMs to plan for) or None, got {type(num_sms).__name__}")
    most = _physical_sm_count(device)
    if not 1 <= num_sms <= most:
        gpu = torch.cuda.is_available() and (device is None or device.type == "cuda")
        raise ValueError(f"{where}: 'num_sms' must be from 1 to {most} (the "
                         f"{'GPU' if gpu else 'largest Hopper part'}'s SM count), got {num_sms}")


def planned_spec(m: int, n: int, k: int, out_dtype: torch.dtype, num_sms: int, gpu_name: str | None = None) -> Fp8GemmSpec:
    """The instantiation a dense shape uses: the tuned choice for this GPU model where one is recorded, else the
    cost model's."""
    problem = GemmProblem(m, n, k, num_sms, out_dtype)
    config = tuning_db(gpu_name).lookup_problem(problem) if gpu_name is not None else None
    return Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=choose_config(problem) if config is None else config)


_tuned: TunedLookups[GemmConfig] = TunedLookups()


def tuned_config(device_index: int, m: int, n: int, k: int, out_dtype: torch.dtype,
                 num_sms: int | None = None) -> GemmConfig | None:
    """The measured config for this shape's M bucket on this GPU model and `num_sms` SMs (None: the device's,
    under the DEEPGEMM_NUM_SMS cap; entries are keyed by the SM count), or None (the plan then asks the cost model);
    looked up once per shape. DEEPGEMM_AUTOTUNE=1: an untuned bucket is measured first and recorded."""
    sms = sm_count(device_index) if num_sms is None else num_sms
    problem = GemmProblem(m, n, k, sms, out_dtype)
    return _tuned.get((device_index, m, n, k, out_dtype, sms),
                      lambda: tuning_db(device_name(device_index)).lookup_problem(problem),
                      lambda: tune_fp8_gemm_nt(m, n, k, out_dtype=out_dtype, device=device_index, num_sms=sms))
