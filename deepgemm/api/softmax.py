"""Fused row softmax (a scale and an optional causal mask in the same pass) and its backward."""

from __future__ import annotations

import math

import torch

from deepgemm.api.backend import backend_for
from deepgemm.api.ready_launches import keep
from deepgemm.api.validation import MAX_ROWS, require_dtype, require_same_device, require_tensor
from deepgemm.kernels.softmax.launch import softmax_backward_cuda, softmax_forward_launch
from deepgemm.reference import softmax_backward_reference, softmax_reference

DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Metadata of inputs that passed the checks on the kernel path without a copy (shape, strides, dtype, device, scale,
# causal) -> (rows, n, row stride, causal query rows, device index): a warm call goes straight to the launch.
_kernel_ready: dict[tuple, tuple[int, int, int, int, int]] = {}


def check_scale(scale: object, where: str) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{where}: 'scale' must be a real number (int or float), got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"{where}: 'scale' must be finite, got {scale}")
    return float(scale)


def _check_rows(x: torch.Tensor, name: str, where: str) -> None:
    """Sizes the kernels index without wrapping: columns and rows (the product of the leading dimensions) below
    2^31."""
    n = x.shape[-1] if x.dim() else 1
    rows = x.numel() // n if n else 0
    for what, size in (("columns (its last dimension)", n), ("rows (the product of its leading dimensions)", rows)):
        if size > MAX_ROWS:
            raise ValueError(f"{where}: '{name}' has {size} {what}, past the kernels' 32-bit index limit ({MAX_ROWS})")


def require_bool(value: object, name: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{where}: '{name}' must be a bool, got {type(value).__name__}")
    return value


def check_softmax(x: object, scale: object, causal: object, where: str = "softmax") -> tuple[torch.Tensor, float]:
    """softmax's argument rules (shared with its fake kernel)."""
    tensor = require_tensor(x, "x", where)
    require_dtype(tensor, "x", where, DTYPES)
    if tensor.dim() < 1:
        raise ValueError(f"{where}: 'x' must have at least 1 dimension (the softmax runs over the last), got a scalar")
    require_bool(causal, "causal", where)
    if causal and tensor.dim() < 2:
        raise ValueError(f"{where}: causal=True needs x as [..., sq, n] (at least 2-D), got shape {tuple(tensor.shape)}")
    value = check_scale(scale, where)
    _check_rows(tensor, "x", where)
    return tensor, value


def check_softmax_backward(y: object, dy: object, scale: object,
                           where: str = "softmax_backward") -> tuple[torch.Tensor, torch.Tensor, float]:
    """softmax_backward's argument rules (shared with its fake kernel)."""
    y_ = require_tensor(y, "y", where)
    dy_ = require_tensor(dy, "dy", where)
    require_dtype(y_, "y", where, DTYPES)
    if dy_.dtype != y_.dtype:
        raise TypeError(f"{where}: 'dy' must have y's dtype {y_.dtype}, got {dy_.dtype}")
    if dy_.shape != y_.shape:
        raise ValueError(f"{where}: 'dy' must have y's shape {tuple(y_.shape)}, got {tuple(dy_.shape)}")
    if y_.dim() < 1:
        raise ValueError(f"{where}: 'y' must have at least 1 dimension, got a scalar")
    require_same_device(where, y=y_, dy=dy_)
    _check_rows(y_, "y", where)
    return y_, dy_, check_scale(scale, where)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, n] with a unit column stride: a view where the leading dimensions collapse, else a copy."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    return rows if rows.stride(1) == 1 or n == 1 else rows.contiguous()


def softmax(x: torch.Tensor, *, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
    """softmax(scale * x) over the last dimension, with an optional causal mask, in one pass: a new tensor of x's
    shape and dtype.

    The math runs in float32 (exp, max and sum), the result is rounded to x's dtype. With causal=True, x is read as
    attention scores [..., sq, n] (queries by keys) and query i sees key j only where j <= i + n - sq: the mask is
    aligned to the bottom-right corner, as FlashAttention's (the upper triangle is masked when sq == n; with a KV
    cache, n > sq, the last query sees every key). Masked positions give 0, and a query that sees no key
    (sq > n) gives a row of zeros, not NaN. Otherwise NaN and infinities follow torch.softmax: a NaN or +inf in a
    row, or a row of -inf, gives a NaN row.

    A row of up to 32768 bfloat16/float16 (16384 float32) values is read once and written once from registers; a
    longer one is split over a cluster of up to 8 CTAs (still read once) while the rows alone would leave SMs idle,
    and is otherwise read twice (the second read mostly from L2). On an sm_90 GPU our kernel runs; elsewhere the
    reference path (torch in float32) gives the result after the same checks. Differentiable (through the public
    deepgemm.softmax): the backward is one fused pass as well, and is itself differentiable (double backward).

    Args:
        x: float32, bfloat16 or float16, at least 1-D (2-D with causal); any strides (a view whose leading dimensions
            do not collapse, or whose last dimension is strided, is copied first).
        scale: multiplies x before the softmax (e.g. 1 / sqrt(head_dim)); any finite number.
        causal: apply the bottom-right-aligned causal mask over the last two dimensions.

    Returns:
        A new contiguous tensor of x's shape and dtype.

    Raises:
        TypeError: `x` is not a tensor or has another dtype, `scale` is not a number, `causal` not a bool.
        ValueError: `x` is 0-D (or 1-D with causal), `scale` is not finite, or x has 2^31 or more rows or columns.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError, deepgemm.GraphCaptureError: the first
            GPU call of a row length class and dtype could not compile, cache or load its kernel (or ran while a
            CUDA graph was being captured).

    Example::

        scores = torch.randn(8, 32, 1024, 1024, device="cuda", dtype=torch.bfloat16)   # [batch, heads, sq, sk]
        probs = deepgemm.softmax(scores, scale=128 ** -0.5, causal=True)
    """
    plain = type(x) is torch.Tensor and type(causal) is bool and type(scale) in (float, int)  # (True == 1 as keys)
    key = (x.shape, x.stride(), x.dtype, x.device, scale, causal) if plain else None
    ready = _kernel_ready.get(key) if key is not None else None
    source = x
    if ready is None:
        x, scale = check_softmax(x, scale, causal)
        if x.numel() == 0:
            return torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if backend_for(x) != "sm90":
            return softmax_reference(x, scale, causal).contiguous()
        source = _rows(x)
        ready = (source.shape[0], x.shape[-1], source.stride(0), x.shape[-2] if causal else 1, x.device.index)
        if key is not None and source.data_ptr() == x.data_ptr():  # a view: the call needed no copy
            keep(_kernel_ready, key, ready)
    rows, n, stride, sq, index = ready
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    softmax_forward_launch(source.data_ptr(), stride, y.data_ptr(), n, rows, n, x.dtype, float(scale), causal, sq,
                           index)
    return y


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The gradient of x in y = softmax(scale * x (+ mask)): dx = scale * y * (dy - sum(dy * y)) over the last
    dimension, in float32, rounded to y's dtype, in one fused pass (masked positions have y = 0 and get 0).

    Args:
        y: the forward's output; float32, bfloat16 or float16, at least 1-D.
        dy: the gradient of y: y's shape and dtype, on y's device.
        scale: the forward's scale.

    Returns:
        A new contiguous tensor of y's shape and dtype.

    Raises:
        TypeError, ValueError: as softmax, and `dy` differs from `y` in shape, dtype or device.
    """
    y, dy, scale = check_softmax_backward(y, dy, scale)
    if y.numel() == 0:
        return torch.empty(y.shape, dtype=y.dtype, device=y.device)
    if backend_for(y) != "sm90":
        return softmax_backward_reference(y, dy, scale).contiguous()
    n = y.shape[-1]
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    softmax_backward_cuda(_rows(y), _rows(dy), dx.view(-1, n), scale)
    return dx
