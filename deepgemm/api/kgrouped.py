"""K-grouped FP8 GEMM for the MoE expert weight gradient (Wgrad): groups split the K (token) dimension."""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import torch

from deepgemm.api.backend import backend_for
from deepgemm.api.layout import tma_rows, to_mn_major_tma_aligned
from deepgemm.api.validation import (
    MAX_ROWS,
    refuse_grad,
    require_aligned,
    require_dtype,
    require_no_overlap,
    require_pair,
    require_rank,
    require_row_count,
    require_same_device,
    require_shape,
    require_tensor,
    require_tma_strides,
    require_writable,
)
from deepgemm.jit.runtime import refuse_during_capture, stream_capturing
from deepgemm.kernels.sm90_fp8_gemm_1d1d.plan import get_kgrouped_plan
from deepgemm.kernels.sm90_fp8_gemm_1d1d.spec import tma_stores
from deepgemm.reference import k_grouped_reference

FP8 = torch.float8_e4m3fn
K_ALIGNMENT = 128


@dataclass(frozen=True)
class _Upload:
    tensor: torch.Tensor
    stream: int  # the raw stream the upload was enqueued on
    done: torch.cuda.Event


class _DeviceOffsets:
    """int32 [G + 1] cumulative K offsets on the device, one tensor per (device, ks).

    The first call with a new ks uploads them (pinned host buffer, no host synchronisation) and must be
    eager; later calls reuse the tensor, so they can be captured. An entry a CUDA graph captured is
    never freed (the graph keeps reading it); the others are evicted oldest first past CAPACITY.
    """

    CAPACITY = 256

    def __init__(self) -> None:
        self._recent: OrderedDict[tuple[int, tuple[int, ...]], _Upload] = OrderedDict()
        self._captured: dict[tuple[int, tuple[int, ...]], _Upload] = {}
        self._lock = threading.Lock()

    def get(self, device: torch.device, ks: tuple[int, ...], where: str = "k_grouped_fp8_gemm_tn_contiguous"
            ) -> torch.Tensor:
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, ks)
        capturing = stream_capturing(index)  # the tensors' device: it need not be the current one
        with self._lock:
            entry = self._captured.get(key)
            if entry is None and key in self._recent:
                if capturing:
                    entry = self._captured[key] = self._recent.pop(key)
                else:
                    self._recent.move_to_end(key)
                    entry = self._recent[key]
        if entry is None:
            refuse_during_capture(f"{where} with a new ks ({len(ks)} groups; its offsets "
                                  "are uploaded on the first call)", index)
            cumulative = [0]
            for k in ks:
                cumulative.append(cumulative[-1] + k)
            with torch.cuda.device(index):
                tensor = torch.tensor(cumulative, dtype=torch.int32).pin_memory().to(device, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
                entry = _Upload(tensor, torch.cuda.current_stream(index).cuda_stream, done)
            with self._lock:
                self._recent[key] = entry
                while len(self._recent) > self.CAPACITY:
                    self._recent.popitem(last=False)
        if not capturing:
            stream = torch.cuda.current_stream(index)
            if stream.cuda_stream != entry.stream:
                stream.wait_event(entry.done)  # the upload ran on another stream
                entry.tensor.record_stream(stream)  # an eviction must not recycle it under this stream's kernel
        return entry.tensor


_offsets = _DeviceOffsets()


# Validated `ks` lists/tuples of plain ints (so 128.0 or False never hit an entry made by 128 or 0): the
# per-call check is then a hash of the values instead of a Python loop over G. Other inputs (tensors,
# numpy integers) take the full check every call.
_VALIDATED_KS: dict[tuple[int, ...], tuple[int, ...]] = {}
_VALIDATED_KS_CAPACITY = 256
_PLAIN_INT = {int}


_FP8_KS_RULE = "each group's token segment holds whole 1x128 scale blocks"


def check_ks(ks: object, where: str, why: str = _FP8_KS_RULE) -> tuple[int, ...]:
    """`ks` as a tuple of ints, each a non-negative multiple of 128 (`why` says why, in the error)."""
    key = tuple(ks) if isinstance(ks, (list, tuple)) and set(map(type, ks)) <= _PLAIN_INT else None
    if key is not None:
        hit = _VALIDATED_KS.get(key)
        if hit is not None:
            return hit
    sizes = _validate_ks(ks, where, why)
    if key is not None:
        if len(_VALIDATED_KS) >= _VALIDATED_KS_CAPACITY:
            _VALIDATED_KS.clear()
        _VALIDATED_KS[key] = sizes
    return sizes


def ks_entry(value: object, g: int, where: str) -> int:
    """`ks[g]` as an int: ints and numpy integers, never floats or bools (the eager and the traced path's rule)."""
    # (checked before operator.index rather than by catching its TypeError: torch 2.11's dynamo does not trace the
    # except clause and raised the bare TypeError under torch.compile)
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{where}: 'ks[{g}]' must be an int, got {type(value).__name__}")
    return operator.index(value)  # type: ignore[arg-type]


def _validate_ks(ks: object, where: str, why: str) -> tuple[int, ...]:
    if isinstance(ks, torch.Tensor):
        require_tensor(ks, "ks", where)  # (a dense one)
        if ks.is_cuda:
            raise TypeError(f"{where}: 'ks' must be host values (a list of ints or a CPU tensor); a CUDA tensor would "
                            "force a device synchronisation")
        if ks.dim() != 1 or ks.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{where}: 'ks' must be a 1-D int32/int64 tensor, got {ks.dtype} {tuple(ks.shape)}")
        ks = ks.tolist()
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Iterable):
        raise TypeError(f"{where}: 'ks' must be a sequence of ints (tokens per group), got {type(ks).__name__}")
    if isinstance(ks, (AbstractSet, Mapping)):  # their iteration order is not the groups' order
        raise TypeError(f"{where}: 'ks' must be an ordered sequence of ints (tokens per group, group 0 first), got "
                        f"{type(ks).__name__}")
    values = []
    for g, value in enumerate(ks):
        k = ks_entry(value, g, where)
        if k < 0 or k % K_ALIGNMENT:
            raise ValueError(f"{where}: 'ks[{g}]'={k} must be a non-negative multiple of {K_ALIGNMENT} ({why})")
        values.append(k)
    return tuple(values)


def k_grouped_fp8_gemm_tn_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    ks: Sequence[int] | torch.Tensor,
    c: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[g] = c[g] + A_g^T B_g for every group g, FP32, with 1x128 scales on both operands (1D1D).

    The groups' token segments lie back to back along the K dimension: group g owns tokens
    [sum(ks[:g]), sum(ks[:g + 1])). For the expert weight gradient dW_g = dY_g^T X_g, pass the
    activations transposed so tokens are contiguous (what the tensor cores read), so A_g^T B_g
    is A[:, seg g] @ B[:, seg g]^T scaled per row and 128-token block on both sides.

    Args:
        a = (A e4m3 [M, K_total], sfa float32 [M, K_total/128]): what quantize_per_token_group(dY.t()) returns;
            A has unit stride along K_total (tokens) and 16-byte aligned rows; K_total is a multiple of 128.
        b = (B e4m3 [N, K_total], sfb float32 [N, K_total/128]): what quantize_per_token_group(X.t()) returns,
            under A's rules.
        out: float32 [G, M, N], contiguous, written and returned.
        ks: tokens per group (host ints or a CPU int32/int64 tensor, each a multiple of 128, summing to K_total;
            0 is allowed: that group's output is c[g], or zeros). The offsets are uploaded once per distinct ks,
            so a call can be captured in a CUDA graph after it has run once with the same ks.
        c: None or float32 [G, M, N], contiguous; it may be `out` itself (accumulate in place).

    Raises:
        TypeError: `a` or `b` is not a pair of tensors, a dtype is wrong (A, B not float8_e4m3fn, scales, `out`,
            `c` not float32), or `ks` is not host ints (a CUDA tensor, floats, bools).
        ValueError: a shape, device or layout rule is broken, on every path: A and B disagree on K_total,
            K_total or a `ks` entry not a multiple of 128, `ks` not summing to K_total, a scale, `out` or `c`
            shape, `out` or `c` not contiguous, rows not unit-stride or 16-byte aligned, tensors on two devices,
            `out` sharing memory with an operand or with a `c` that is not `out`.
        deepgemm.NotDifferentiableError: an argument requires grad while grad mode is on.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError: the first call of a shape could not
            compile, cache or load its kernel (kernel path).
        deepgemm.GraphCaptureError: that first call, or the first call with a new `ks`, happens while a CUDA
            graph is being captured.

    Example::

        ks = [256, 0, 384]                                                   # tokens per expert
        dy = torch.randn(sum(ks), 4096, device="cuda", dtype=torch.bfloat16)  # [tokens, M]
        x = torch.randn(sum(ks), 7168, device="cuda", dtype=torch.bfloat16)   # [tokens, N]
        a = deepgemm.quantize_per_token_group(dy.t())
        b = deepgemm.quantize_per_token_group(x.t())
        dw = torch.empty(len(ks), 4096, 7168, device="cuda", dtype=torch.float32)
        deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, dw, ks)              # dw[g] = dY_g^T X_g
        deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, dw, ks, c=dw)        # dw[g] += dY_g^T X_g
    """
    a_q, sfa, b_q, sfb, out_t, c, sizes = check_k_grouped(a, b, out, ks, c)
    check_k_grouped_memory(a_q, sfa, b_q, sfb, out_t, c)
    return _run_k_grouped(a_q, sfa, b_q, sfb, out_t, c, sizes)


_WHERE = "k_grouped_fp8_gemm_tn_contiguous"


def check_k_grouped(a: object, b: object, out: object, ks: object, c: object
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                               tuple[int, ...]]:
    """The metadata rules (shared with the custom ops' fake kernels); returns the tensors and the validated ks."""
    where = _WHERE
    a_q, sfa = require_pair(a, "a", where)
    b_q, sfb = require_pair(b, "b", where)
    for name, t in (("a[0]", a_q), ("b[0]", b_q)):
        require_dtype(t, name, where, (FP8,))
        require_rank(t, name, where, 2)
    (m, k_total), (n, k_b) = a_q.shape, b_q.shape
    if k_b != k_total:
        raise ValueError(f"{where}: 'a[0]' has K_total={k_total} tokens but 'b[0]' has {k_b}; they must match")
    if k_total % K_ALIGNMENT:
        raise ValueError(f"{where}: 'a[0]' has K_total={k_total} tokens; K_total must be a multiple of {K_ALIGNMENT}")
    for name, t, rows in (("a[1]", sfa, m), ("b[1]", sfb, n)):
        require_dtype(t, name, where, (torch.float32,))
        require_shape(t, name, where, (rows, k_total // K_ALIGNMENT), "one scale per row and 128 tokens")
    sizes = check_ks(ks, where)
    if sum(sizes) != k_total:
        raise ValueError(f"{where}: 'ks' sums to {sum(sizes)} tokens but the operands hold K_total={k_total}")
    out_t, c_t = check_k_grouped_outputs(out, c, (len(sizes), m, n), where,
                                         {"a": a_q, "sfa": sfa, "b": b_q, "sfb": sfb})
    require_tma_strides(a_q, "a[0]", where)
    require_tma_strides(b_q, "b[0]", where)
    require_row_count(m, "'a[0]' (M)", where)
    require_row_count(n, "'b[0]' (N)", where)
    if k_total > MAX_ROWS:
        raise ValueError(f"{where}: 'a[0]' has K_total={k_total} tokens, past the kernel's 32-bit K coordinates "
                         f"({MAX_ROWS})")
    refuse_grad(where, **{"a[0]": a_q, "a[1]": sfa, "b[0]": b_q, "b[1]": sfb, "out": out_t, "c": c_t})
    return a_q, sfa, b_q, sfb, out_t, c_t, sizes


def check_k_grouped_outputs(out: object, c: object, shape: tuple[int, int, int], where: str,
                            operands: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`out` and the optional `c` of a k-grouped GEMM: float32 [G, M, N], contiguous (each group's rows back to
    back), on the operands' device."""
    out_t = require_tensor(out, "out", where)
    require_dtype(out_t, "out", where, (torch.float32,))
    require_shape(out_t, "out", where, shape, "[G, M, N] (one FP32 gradient per group)")
    require_writable(out_t, "out", where)
    tensors = {**operands, "out": out_t}
    c_t = None
    if c is not None:
        c_t = require_tensor(c, "c", where)
        require_dtype(c_t, "c", where, (torch.float32,))
        require_shape(c_t, "c", where, shape, "the same [G, M, N] as out")
        tensors["c"] = c_t
    require_same_device(where, **tensors)
    # The kernel's layout rules, on every path (the reference path could take more, the kernel cannot).
    for name, maybe in (("out", out_t), ("c", c_t)):
        if maybe is not None and not maybe.is_contiguous():
            raise ValueError(f"{where}: '{name}' must be contiguous (each group's rows are stored back to back), got "
                             f"strides {maybe.stride()}")
    return out_t, c_t


def check_k_grouped_memory(a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor,
                           out: torch.Tensor, c: torch.Tensor | None) -> None:
    """The rules that read data pointers (eager calls only; fake tensors have no storage): A, B, out and c start
    16-byte aligned; out shares no memory with an operand, nor with c unless c is out (accumulate in place; an
    identical view of out's memory counts as out)."""
    where = _WHERE
    require_aligned(a_q, "a[0]", where)
    require_aligned(b_q, "b[0]", where)
    for name, maybe in (("out", out), ("c", c)):
        if maybe is not None and maybe.data_ptr() % 16 and maybe.numel():
            raise ValueError(f"{where}: '{name}' must start 16-byte aligned (its rows are written and read as "
                             "float pairs and 16-byte units)")
    in_place = c is out or (c is not None and c.data_ptr() == out.data_ptr() and c.shape == out.shape
                            and c.stride() == out.stride())
    require_no_overlap(where, "out", out, (("a[0]", a_q), ("a[1]", sfa), ("b[0]", b_q), ("b[1]", sfb),
                                           ("c", None if in_place else c)))


def _run_k_grouped(a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor, out_t: torch.Tensor,
                   c: torch.Tensor | None, sizes: tuple[int, ...]) -> torch.Tensor:
    (m, k_total), n, groups = a_q.shape, b_q.shape[0], len(sizes)
    if groups == 0 or m == 0 or n == 0:
        return out_t
    if a_q.is_meta:  # no values: the output's metadata is the result
        return out_t
    if backend_for(a_q) == "reference":
        out_t.copy_(k_grouped_reference(a_q, sfa, b_q, sfb, list(sizes), c))
        return out_t
    if k_total == 0:
        return out_t.copy_(c) if c is not None else out_t.zero_()
    # C = out with 16-byte output rows: the kernel adds the products into out by TMA reduce-add and never reads C.
    in_place = c is not None and c.data_ptr() == out_t.data_ptr() and tma_stores(n)
    plan = get_kgrouped_plan(a_q.device.index, m, n, in_place)
    plan.launch(tma_rows(a_q), to_mn_major_tma_aligned(sfa), tma_rows(b_q), to_mn_major_tma_aligned(sfb),
                _offsets.get(a_q.device, sizes), groups, out_t, None if in_place else c)
    return out_t
