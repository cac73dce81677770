"""The fused softmax as custom ops with autograd: `softmax` (functional, differentiable) and `softmax_backward`, and
the public deepgemm.softmax."""

from __future__ import annotations

from typing import Any

import torch

from deepgemm.api import softmax as api
from deepgemm.ops.library import LIBRARY, NAMESPACE, compiling, define


def _impl(x: torch.Tensor, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
    with torch.no_grad():  # the autograd formula below owns the gradient
        return api.softmax(x.detach(), scale=scale, causal=causal)


def _fake(x: torch.Tensor, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
    x, _ = api.check_softmax(x, scale, causal)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _backward_impl(y: torch.Tensor, dy: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return api.softmax_backward(y, dy, scale)


def _backward_fake(y: torch.Tensor, dy: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    y, _, _ = api.check_softmax_backward(y, dy, scale)
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


define("softmax(Tensor x, float scale=1.0, bool causal=False) -> Tensor", _impl, _fake)
define("softmax_backward(Tensor y, Tensor dy, float scale=1.0) -> Tensor", _backward_impl, _backward_fake)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.scale = inputs[1] if len(inputs) > 1 else 1.0
    ctx.save_for_backward(output)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    (y,) = ctx.saved_tensors
    dx = torch.ops.deepgemm.softmax_backward(y, grad.to(y.dtype), ctx.scale)
    return dx, None, None


torch.library.register_autograd(f"{NAMESPACE}::softmax", _backward, setup_context=_setup_context, lib=LIBRARY)


def _setup_backward_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    y, dy, *rest = inputs
    ctx.scale = rest[0] if rest else 1.0
    ctx.save_for_backward(y, dy)


def _double_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """Gradients of dx = s y (dy - sum(dy y)) (double backward): d/d(dy) is the same formula applied to the incoming
    gradient g (one fused pass); d/dy = s (g (dy - sum(dy y)) - sum(g y) dy), in float32 torch ops."""
    y, dy = ctx.saved_tensors
    grad_y = grad_dy = None
    if ctx.needs_input_grad[1]:
        grad_dy = torch.ops.deepgemm.softmax_backward(y, grad.to(y.dtype), ctx.scale)
    if ctx.needs_input_grad[0]:
        y32, dy32, g32 = y.float(), dy.float(), grad.float()
        grad_y = (ctx.scale * (g32 * (dy32 - (dy32 * y32).sum(-1, keepdim=True))
                               - (g32 * y32).sum(-1, keepdim=True) * dy32)).to(y.dtype)
    return grad_y, grad_dy, None


torch.library.register_autograd(f"{NAMESPACE}::softmax_backward", _double_backward,
                                setup_context=_setup_backward_context, lib=LIBRARY)

_grad_enabled = torch.is_grad_enabled


def softmax(x: torch.Tensor, *, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
    if not compiling():
        try:
            differentiate = _grad_enabled() and x.requires_grad
        except AttributeError:  # not a tensor: the api's validation names the argument
            differentiate = False
        if not differentiate:
            return api.softmax(x, scale=scale, causal=causal)
        api.check_softmax(x, scale, causal)
    else:  # the schema would coerce causal=1 or scale=True: the eager rules first
        api.check_scale(scale, "softmax")
        api.require_bool(causal, "causal", "softmax")
    return torch.ops.deepgemm.softmax(x, float(scale), causal)


softmax.__doc__ = api.softmax.__doc__
