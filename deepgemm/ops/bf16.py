"""BF16 GEMMs as custom ops with autograd: `bf16_gemm` (functional, differentiable), `bf16_gemm_out` and
`bf16_gemm_accumulate` (C += A @ B^T in place), and the public bf16_gemm_{nt,nn,tn,tt}.

The backward of every layout is two GEMMs in other layouts on our kernels, each computing a gradient in its
input's stored orientation (so it meets the same 16-byte row rules the input met).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from deepgemm.api import bf16 as api
from deepgemm.api.gemm import allocate_out
from deepgemm.ops.library import NAMESPACE, LIBRARY, compiling, define

BF16 = torch.bfloat16


def _impl(a: torch.Tensor, b: torch.Tensor, layout: str, c: torch.Tensor | None = None,
          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    api.check_bf16_gemm(layout, a, b, None, c, out_dtype, differentiable=True)
    with torch.no_grad():  # the autograd formula below owns the gradients
        return api.bf16_gemm(layout, a.detach(), b.detach(), c=None if c is None else c.detach(), out_dtype=out_dtype)


def _fake(a: torch.Tensor, b: torch.Tensor, layout: str, c: torch.Tensor | None = None,
          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    _, _, dtype, device = api.check_bf16_gemm(layout, a, b, None, c, out_dtype, differentiable=True)
    m, n, _, _ = api.problem_shape(layout, a, b)
    return allocate_out(m, n, dtype, device)


def _out_impl(a: torch.Tensor, b: torch.Tensor, layout: str, c: torch.Tensor | None, out: torch.Tensor) -> None:
    api.bf16_gemm(layout, a, b, out, c=c)


def _out_fake(a: torch.Tensor, b: torch.Tensor, layout: str, c: torch.Tensor | None, out: torch.Tensor) -> None:
    api.check_bf16_gemm(layout, a, b, out, c, None)


def _accumulate_impl(a: torch.Tensor, b: torch.Tensor, layout: str, c: torch.Tensor) -> None:
    api.bf16_gemm(layout, a, b, c, c=c)


def _accumulate_fake(a: torch.Tensor, b: torch.Tensor, layout: str, c: torch.Tensor) -> None:
    api.check_bf16_gemm(layout, a, b, c, c, None)


define("bf16_gemm(Tensor a, Tensor b, str layout, Tensor? c=None, ScalarType? out_dtype=None) -> Tensor", _impl, _fake)
define("bf16_gemm_out(Tensor a, Tensor b, str layout, Tensor? c, Tensor(a!) out) -> ()", _out_impl, _out_fake)
define("bf16_gemm_accumulate(Tensor a, Tensor b, str layout, Tensor(a!) c) -> ()", _accumulate_impl, _accumulate_fake)


def _readable_view(t: torch.Tensor) -> torch.Tensor:
    """`t` where our kernels can read it in place (a unit stride in one dimension, a non-zero one in the other:
    row-major or column-major), else a contiguous copy (e.g. the stride-0 gradient of a `sum()`)."""
    rows, cols = t.shape
    if (t.stride(1) == 1 or cols == 1) and (t.stride(0) > 0 or rows == 1):
        return t
    if (t.stride(0) == 1 or rows == 1) and (t.stride(1) > 0 or cols == 1):
        return t
    return t.contiguous()


def matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y (BF16 out) for 2-D BF16 tensors on our kernels: the layout is read off the strides (a row-major x is A
    [M, K], a column-major one A given as [K, M]; likewise y as B [K, N] or [N, K]); other views are copied once. A
    product our kernels cannot take (N % 8 != 0, or rows that are not 16 bytes apart in either major order — only
    a one-row or odd-sized input of the forward pass leads here) runs as a float32 torch.matmul."""
    if y.shape[1] % 8 != 0:
        return (x.float() @ y.float()).to(BF16)
    x = _readable_view(x)
    y = _readable_view(y)
    first, a = ("n", x) if x.stride(1) == 1 else ("t", x.t())
    second, b = ("n", y) if y.stride(1) == 1 else ("t", y.t())
    try:  # the op, not the api: a backward traced by AOT autograd must see a graph node
        return torch.ops.deepgemm.bf16_gemm(a, b, first + second, None, None)
    except ValueError:
        pass
    try:  # the other major order of each operand (a copy), whose rows may meet the 16-byte rule
        return torch.ops.deepgemm.bf16_gemm(x.contiguous(), y.contiguous(), "nn", None, None)
    except ValueError:
        return (x.float() @ y.float()).to(BF16)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b, layout, c, _ = inputs
    ctx.layout = layout
    ctx.c_dtype = None if c is None else c.dtype
    ctx.save_for_backward(a, b)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    a, b = ctx.saved_tensors
    layout = ctx.layout
    d = grad.to(BF16).contiguous()  # [M, N], N % 8 == 0: its rows (and d.t()'s columns) are TMA-readable
    x = a if layout[0] == "n" else a.t()   # logical A [M, K]
    w = b if layout[1] == "t" else b.t()   # logical B [N, K]
    grad_a = grad_b = grad_c = None
    if ctx.needs_input_grad[0]:
        grad_a = matmul(d, w) if layout[0] == "n" else matmul(w.t(), d.t())          # dX [M, K] or dX^T [K, M]
    if ctx.needs_input_grad[1]:
        grad_b = matmul(d.t(), x) if layout[1] == "t" else matmul(x.t(), d)          # dW [N, K] or dW^T [K, N]
    # The dispatcher drops trailing arguments left at their defaults (c=None, out_dtype=None) from the inputs.
    if len(ctx.needs_input_grad) > 3 and ctx.needs_input_grad[3]:
        grad_c = grad.to(ctx.c_dtype)
    return grad_a, grad_b, None, grad_c, None


torch.library.register_autograd(f"{NAMESPACE}::bf16_gemm", _backward, setup_context=_setup_context, lib=LIBRARY)

_grad_enabled = torch.is_grad_enabled


def _public(layout: str) -> Callable[..., torch.Tensor]:
    def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *, c: torch.Tensor | None = None,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
        if not compiling():
            try:  # (attribute reads, not a generator: this is the eager hot path)
                differentiate = _grad_enabled() and (a.requires_grad or b.requires_grad
                                                     or (c is not None and c.requires_grad))
            except AttributeError:  # not tensors: the api's validation names the argument
                differentiate = False
            if not differentiate:
                return api.bf16_gemm(layout, a, b, out, c=c, out_dtype=out_dtype)
        if out is None:
            return torch.ops.deepgemm.bf16_gemm(a, b, layout, c, out_dtype)
        if out_dtype is not None and out_dtype != out.dtype:
            raise ValueError(f"bf16_gemm_{layout}: 'out_dtype' is {out_dtype} but 'out' has dtype {out.dtype}")
        if c is out:
            torch.ops.deepgemm.bf16_gemm_accumulate(a, b, layout, out)
        else:
            torch.ops.deepgemm.bf16_gemm_out(a, b, layout, c, out)
        return out

    gemm.__name__ = gemm.__qualname__ = f"bf16_gemm_{layout}"
    return gemm


_SHAPES = {"nt": ("[M, K]", "[N, K]"), "nn": ("[M, K]", "[K, N]"), "tn": ("[K, M]", "[K, N]"), "tt": ("[K, M]", "[N, K]")}


def _doc(layout: str) -> str:
    a_form, b_form = _SHAPES[layout]
    rules = {"nt": "K % 8 == 0 (A's and B's rows)", "nn": "K % 8 == 0 (A's rows)",
             "tn": "M % 8 == 0 (A's rows)", "tt": "M % 8 == 0 (A's rows) and K % 8 == 0 (B's rows)"}[layout]
    a_arg = "x" if layout[0] == "n" else "x.t()"
    b_arg = "w" if layout[1] == "t" else "w.t()"
    return f"""D[M, N] = C + A @ B^T in BF16 with FP32 accumulation; A given as {a_form}, B given as {b_form}.

    Every layout is native: wgmma reads each operand from shared memory in its stored major order (no copy). On an
    sm_90 GPU our kernel runs; on CPU tensors or other GPUs the reference path (float32 matmul) gives the result,
    after the same checks. Differentiable: when `a`, `b` or `c` require grad (and `out` is None) the backward runs
    two BF16 GEMMs in other layouts on our kernels.

    Args:
        a: bfloat16 {a_form}; unit stride along its last dimension, rows a multiple of 16 bytes apart, 16-byte
            aligned base.
        b: bfloat16 {b_form}; the same row rules.
        out: optional [M, N] bfloat16 or float32 tensor to write (the same row rules, no memory shared with `a` or
            `b`); None: a new tensor is returned.
        c: optional addend [M, N], bfloat16 or float32 (the same row rules); it may be `out` itself (D += A @ B^T
            in place, e.g. gradient accumulation), otherwise it must not overlap `out`.
        out_dtype: the new output's dtype: torch.bfloat16 or torch.float32; default c's dtype, else bfloat16.

    Layout rules here: N % 8 == 0 (the output's 16-byte rows) and {rules}, where an operand has more than one
    row; any M >= 0 (tails handled in the kernel, no padding copies); K = 0 gives C (or zeros).

    Returns:
        `out`, or the new [M, N] tensor.

    Raises:
        TypeError: an argument is not a tensor, a dtype is wrong (operands not bfloat16, `c`/`out`/`out_dtype`
            not bfloat16/float32).
        ValueError: the operands disagree on K, `c`/`out` is not [M, N], a row rule above is broken, tensors are on
            two devices, `out` overlaps itself, an operand or (other than being it) `c`, or `out_dtype` disagrees
            with `out`.
        deepgemm.NotDifferentiableError: `out` is given while an argument requires grad (grad mode on).
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError: the first call of a shape could not
            compile, cache or load its kernel.
        deepgemm.GraphCaptureError: that first call happens while a CUDA graph is being captured.

    Example::

        x = torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2112, 7168, device="cuda", dtype=torch.bfloat16)
        y = deepgemm.bf16_gemm_{layout}({a_arg if layout[0] == "n" else "x.t().contiguous()"}, {b_arg if layout[1] == "t" else "w.t().contiguous()"})   # x @ w.t(), bfloat16 [4096, 2112]
        acc = torch.zeros(4096, 2112, device="cuda", dtype=torch.float32)
        deepgemm.bf16_gemm_{layout}({a_arg if layout[0] == "n" else "x.t().contiguous()"}, {b_arg if layout[1] == "t" else "w.t().contiguous()"}, acc, c=acc)    # acc += x @ w.t()
    """


bf16_gemm_nt = _public("nt")
bf16_gemm_nn = _public("nn")
bf16_gemm_tn = _public("tn")
bf16_gemm_tt = _public("tt")
for _fn in (bf16_gemm_nt, bf16_gemm_nn, bf16_gemm_tn, bf16_gemm_tt):
    _fn.__doc__ = _doc(_fn.__name__[-2:])
