"""`fp8_linear(x, weight, bias)`: a differentiable linear layer whose three GEMMs run in FP8 on our kernels.

DeepSeek-V3's recipe: every GEMM operand is quantized to e4m3 per call from the high-precision tensors autograd
holds (activations and gradients per 1x128 group, weights per 128x128 block), products accumulate in FP32 with
the scales applied every 128 K:

    Fprop  y  = x W^T      fp8_gemm_nt(q(x) along K, q(W) per block)
    Dgrad  dx = dy W       fp8_gemm_nt(q(dy) along N, q(W)^T: the forward's blocks transposed, bit-identical to
                           quantizing W^T)
    Wgrad  dW = dy^T x     the 1D1D GEMM over tokens (k_grouped_fp8_gemm_tn_contiguous with one group) on dy and x
                           quantized along the tokens, zero-padded to whole 128-token blocks

No transposed or padded copy is made: the per-block quantizer writes q(W) and q(W)^T in one pass, x is read once for
both of its quantizations (quantize_both_ways), dy is quantized by the row and the transposed quantizers. The forward
saves x^T and W^T in e4m3 (with their scales) for the backward, not x.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from deepgemm.api import gemm as gemm_api
from deepgemm.api import kgrouped as kgrouped_api
from deepgemm.api.quant import INPUT_DTYPES
from deepgemm.api.validation import require_dtype, require_same_device, require_tensor
from deepgemm.ops.library import compiling
from deepgemm.ops.quant import (
    quantize_both_ways,
    quantize_per_block,
    quantize_per_block_transposed,
    quantize_per_token_group,
    quantize_transposed,
)
from deepgemm.utils import align_up

BLOCK = 128
ALIGNMENT = 16  # in_features: Fprop's K (16-byte TMA rows of e4m3); out_features: Dgrad's K
_WHERE = "fp8_linear"


def _gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """The GEMM output dtype for a result wanted in `dtype` (float16 is cast from bfloat16 afterwards)."""
    return torch.float32 if dtype == torch.float32 else torch.bfloat16


def _to(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return y if y.dtype == dtype else y.to(dtype)


def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
             need_dx: bool = False, need_dw: bool = False, tokens: int = 0
             ) -> tuple[torch.Tensor, list[torch.Tensor] | None, list[torch.Tensor] | None]:
    """y = x W^T (+ bias) in out_dtype, and the backward's operands where a gradient needs them: x^T quantized along
    the tokens, zero-padded to `tokens` (Wgrad), W^T per block with its scales transposed (Dgrad)."""
    x_t = w_t = None
    if need_dw:  # x along the tokens too (Wgrad's operand), from the same read; saved in FP8 instead of x
        x_q, x_sf, *x_t = quantize_both_ways(x, tokens)
    else:
        x_q, x_sf = quantize_per_token_group(x, BLOCK)
    if need_dx:  # W^T per block (Dgrad's operand), written by the same pass
        w_q, w_sf, *w_t = quantize_per_block_transposed(weight)
    else:
        w_q, w_sf = quantize_per_block(weight, BLOCK)
    y = _to(_gemm((x_q, x_sf), (w_q, w_sf), _gemm_dtype(out_dtype)), out_dtype)
    if bias is not None:  # traced (no-grad forwards only): out of place
        y = _plus_bias(y, bias) if compiling() else y.add_(bias)
    return y, x_t, w_t


def _plus_bias(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """y + bias out of place (the traced form), rounded once to y's dtype as y.add_(bias) is."""
    return (y + bias).to(y.dtype)


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                out_dtype: torch.dtype) -> torch.Tensor:
        need_dx, need_dw, _ = _needs(ctx)
        tokens = align_up(x.shape[0], BLOCK)  # Wgrad's K: whole 128-token blocks
        y, x_t, w_t = _forward(x, weight, bias, out_dtype, need_dx, need_dw, tokens)
        ctx.save_for_backward(*(x_t or (None, None)), *(w_t or (None, None)))
        ctx.tokens, ctx.x_dtype, ctx.weight_dtype = tokens, x.dtype, weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y

    @staticmethod
    @once_differentiable  # (our GEMMs have no double backward: differentiating the gradients raises)
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_qt, x_sft, w_qt, w_sft = ctx.saved_tensors
        need_dx, need_dw, need_db = _needs(ctx)
        tokens = ctx.tokens
        dx = dw = db = None
        if dy.stride(-1) != 1:  # (e.g. the stride-0 gradient of a sum): one copy for both quantizers
            dy = dy.contiguous()
        # dy's two quantizations as two kernels: within a few % of the both-ways kernel the forward uses for x
        # (docs/performance.md, FP8 training: an open lever)
        if need_dx:
            dy_q, dy_sf = quantize_per_token_group(dy, BLOCK)
        if need_dw:
            dy_qt, dy_sft = quantize_transposed(dy, tokens)
        if need_dx:  # dx = dy W: B = W^T [K, N] e4m3 with the block scales transposed
            dx = _to(_gemm((dy_q, dy_sf), (w_qt, w_sft), _gemm_dtype(ctx.x_dtype)), ctx.x_dtype)
        if need_dw:  # dW = dy^T x over the (zero-padded) tokens
            dw = _to(_wgrad((dy_qt, dy_sft), (x_qt, x_sft), tokens), ctx.weight_dtype)
        if ctx.bias_dtype is not None and need_db:
            db = dy.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dx, dw, db, None


def _needs(ctx: Any) -> tuple[bool, bool, bool]:
    """Which of dx, dW, db autograd asks for (each input's requires_grad, at the call)."""
    return ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]


# The step's kernels: the api functions when eager (host time), the custom ops when traced (AOT autograd traces
# the backward in a strict mode that refuses the public wrappers' argument checks; the fake kernels check instead).
# The quantizers are deepgemm.ops.quant's wrappers, which choose the same way.
def _gemm(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype
          ) -> torch.Tensor:
    if compiling():
        return torch.ops.deepgemm.fp8_gemm_nt(a[0], a[1], b[0], b[1], dtype, None)
    return gemm_api.fp8_gemm_nt(a, b, out_dtype=dtype)


def _wgrad(dy_t: tuple[torch.Tensor, torch.Tensor], x_t: tuple[torch.Tensor, torch.Tensor], tokens: int
           ) -> torch.Tensor:
    """dW [N, K] FP32 = dy^T x from the token-major operands: the 1D1D GEMM with one group of `tokens`."""
    if compiling():
        return torch.ops.deepgemm.k_grouped_fp8_gemm_tn_contiguous(dy_t[0], dy_t[1], x_t[0], x_t[1], [tokens])[0]
    out = torch.empty((1, dy_t[0].shape[0], x_t[0].shape[0]), dtype=torch.float32, device=dy_t[0].device)
    return kgrouped_api.k_grouped_fp8_gemm_tn_contiguous(dy_t, x_t, out, [tokens])[0]


def check_fp8_linear(x: object, weight: object, bias: object, out_dtype: object = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.dtype]:
    """fp8_linear's argument rules (every path); returns the tensors and the output dtype."""
    where = _WHERE
    x_t = require_tensor(x, "x", where)
    w_t = require_tensor(weight, "weight", where)
    require_dtype(x_t, "x", where, INPUT_DTYPES)
    require_dtype(w_t, "weight", where, INPUT_DTYPES)
    if w_t.dim() != 2:
        raise ValueError(f"{where}: 'weight' must be 2-D [out_features, in_features], got {tuple(w_t.shape)}")
    n, k = w_t.shape
    if x_t.dim() == 0 or x_t.shape[-1] != k:
        got = f"{x_t.shape[-1]} features in its last dimension" if x_t.dim() else "no dimensions"
        raise ValueError(f"{where}: 'x' has {got}; 'weight' [out_features, in_features] = [{n}, {k}] needs {k}")
    for name, size, role in (("in_features", k, "Fprop's"), ("out_features", n, "Dgrad's")):
        if size % ALIGNMENT:
            raise ValueError(f"{where}: {name}={size} must be a multiple of {ALIGNMENT} ({role} reduction dimension "
                             "is read in 16-byte rows of e4m3); run this layer as torch.nn.functional.linear")
    b_t = None
    if bias is not None:
        b_t = require_tensor(bias, "bias", where)
        require_dtype(b_t, "bias", where, INPUT_DTYPES)
        if tuple(b_t.shape) != (n,):
            raise ValueError(f"{where}: 'bias' must have shape ({n},) (one per output feature), got {tuple(b_t.shape)}")
    tensors = {"x": x_t, "weight": w_t} if b_t is None else {"x": x_t, "weight": w_t, "bias": b_t}
    require_same_device(where, **tensors)
    if out_dtype is not None and out_dtype not in INPUT_DTYPES:
        names = ", ".join(str(d) for d in INPUT_DTYPES)
        raise TypeError(f"{where}: 'out_dtype' must be None (x's dtype) or one of {names}, got {out_dtype!r}")
    return x_t, w_t, b_t, x_t.dtype if out_dtype is None else out_dtype


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y = x W^T (+ bias) with FP8 Fprop, Dgrad and Wgrad: torch.nn.functional.linear for FP8 training.

    `weight` (and `bias`) stay in your precision (the optimizer's master copy, e.g. bfloat16 or float32); each call
    quantizes x per 1x128 group (and, where W needs a gradient, along the tokens too, for Wgrad) and W per 128x128
    block, and the backward quantizes dy (per 1x128 group along the output features for dx, along the tokens for
    dW), as DeepSeek-V3 trains. All three GEMMs
    accumulate in FP32 with the scales applied every 128 K; dx comes back in x's dtype, dW in the weight's, the bias
    gradient (an FP32 sum of dy) in the bias's. Saved for the backward, only where a gradient needs it: x^T and W^T in
    e4m3 with their scales (half the bytes of a BF16 x). torch.autocast does not change what it computes (the output
    in out_dtype, by default x's; the operands are FP8 either way). On CPU tensors and other GPUs the reference path computes
    the same quantized math. Under torch.compile it traces into the graph, forward and backward (fullgraph=True
    holds; the bias gradient is then autograd's sum of dy).

    Args:
        x: float32, bfloat16 or float16 [..., in_features]; dx comes back in its dtype.
        weight: float32, bfloat16 or float16 [out_features, in_features]; both multiples of 16.
        bias: None or [out_features], float32/bfloat16/float16.
        out_dtype: the output's dtype (None: x's), float32/bfloat16/float16; e.g. float32 partial sums that a
            row-parallel layer reduces before rounding once.

    Returns:
        [..., out_features] in out_dtype.

    Raises:
        TypeError: an argument is not a tensor or has another dtype, or `out_dtype` is not allowed.
        ValueError: x's last dimension is not in_features, in_features or out_features is not a multiple of 16,
            `bias` is not [out_features], or the tensors are on two devices.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError, deepgemm.GraphCaptureError: as for
            fp8_gemm_nt, on the first call of a shape (forward or backward).

    Example::

        w = torch.nn.Parameter(torch.randn(2048, 7168, device="cuda") * 0.02)   # float32 master weight
        x = torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = deepgemm.fp8_linear(x, w)            # bfloat16 [4096, 2048]
        y.float().square().mean().backward()     # x.grad bfloat16, w.grad float32, all from FP8 GEMMs
    """
    x_t, w_t, b_t, dtype = check_fp8_linear(x, weight, bias, out_dtype)
    rows = x_t.reshape(-1, w_t.shape[1])
    if not torch.is_grad_enabled():
        y = _forward(rows, w_t, b_t, dtype)[0]  # (no_grad / inference_mode: without the backward's operands)
    elif compiling() and b_t is not None:  # traced: the bias added outside the Function (inside it, torch 2.11's
        y = _plus_bias(_Fp8Linear.apply(rows, w_t, None, dtype), b_t)  # step returned zero dx and dW), db by autograd
    else:
        y = _Fp8Linear.apply(rows, w_t, b_t, dtype)
    return y if x_t.dim() == 2 else y.reshape(*x_t.shape[:-1], w_t.shape[0])
