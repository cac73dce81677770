"""RoPE as custom ops: `rope` (functional, differentiable in q and k; the backward is the inverse rotation) and
`rope_` (in place), and the public deepgemm.rope / deepgemm.rope_."""

from __future__ import annotations

from typing import Any

import torch

from deepgemm.api import rope as api
from deepgemm.ops.library import LIBRARY, NAMESPACE, compiling, define


def _no_k(q: torch.Tensor) -> torch.Tensor:
    """The functional op's second output when there is no k (custom ops return no optional tensors)."""
    return torch.empty((q.shape[0], 0, q.shape[2]), dtype=q.dtype, device=q.device)


def _impl(q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
          interleaved: bool = False, inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():  # the autograd formula below owns the gradients
        q_out, k_out = api.rope(q.detach(), None if k is None else k.detach(), cos_sin_cache, positions,
                                interleaved=interleaved, inverse=inverse)
    return q_out, _no_k(q_out) if k_out is None else k_out


def _fake(q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
          interleaved: bool = False, inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, _, _ = api.check_rope(q, k, cos_sin_cache, positions, interleaved)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return q_out, _no_k(q) if k is None else torch.empty(k.shape, dtype=k.dtype, device=k.device)


def _in_place_impl(q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
                   interleaved: bool = False) -> None:
    api.rope_(q, k, cos_sin_cache, positions, interleaved=interleaved)


def _in_place_fake(q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
                   interleaved: bool = False) -> None:
    q, k, _, _ = api.check_rope(q, k, cos_sin_cache, positions, interleaved, "rope_")
    api.check_rope_in_place(q, k)


define("rope(Tensor q, Tensor? k, Tensor cos_sin_cache, Tensor positions, bool interleaved=False, "
       "bool inverse=False) -> (Tensor, Tensor)", _impl, _fake)
define("rope_(Tensor(a!) q, Tensor(b!)? k, Tensor cos_sin_cache, Tensor positions, bool interleaved=False) -> ()",
       _in_place_impl, _in_place_fake)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, k, cache, positions, *flags = inputs
    ctx.has_k = k is not None
    ctx.interleaved = flags[0] if flags else False
    ctx.inverse = flags[1] if len(flags) > 1 else False
    ctx.save_for_backward(cache, positions)


def _backward(ctx: Any, grad_q: torch.Tensor, grad_k: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    cache, positions = ctx.saved_tensors
    gq, gk = torch.ops.deepgemm.rope(grad_q, grad_k if ctx.has_k else None, cache, positions, ctx.interleaved,
                                     not ctx.inverse)
    return gq, gk if ctx.has_k else None, None, None, None, None


torch.library.register_autograd(f"{NAMESPACE}::rope", _backward, setup_context=_setup_context, lib=LIBRARY)

_grad_enabled = torch.is_grad_enabled


def rope(q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor, positions: torch.Tensor, *,
         interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not compiling():
        try:
            differentiate = _grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad))
        except AttributeError:  # not tensors: the api's validation names the argument
            differentiate = False
        if not differentiate:
            return api.rope(q, k, cos_sin_cache, positions, interleaved=interleaved)
        api.check_rope(q, k, cos_sin_cache, positions, interleaved)  # the op's impl runs under no_grad
    elif not isinstance(interleaved, bool):  # the schema would coerce it
        raise TypeError(f"rope: 'interleaved' must be a bool, got {type(interleaved).__name__}")
    if isinstance(cos_sin_cache, torch.Tensor):
        api.refuse_cache_grad("rope", cos_sin_cache)
    q_out, k_out = torch.ops.deepgemm.rope(q, k, cos_sin_cache, positions, interleaved, False)
    return q_out, None if k is None else k_out


def rope_(q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor, positions: torch.Tensor, *,
          interleaved: bool = False) -> None:
    if not compiling():
        api.rope_(q, k, cos_sin_cache, positions, interleaved=interleaved)
        return
    if not isinstance(interleaved, bool):  # the schema would coerce it
        raise TypeError(f"rope_: 'interleaved' must be a bool, got {type(interleaved).__name__}")
    torch.ops.deepgemm.rope_(q, k, cos_sin_cache, positions, interleaved)


rope.__doc__ = (api.rope.__doc__ or "").replace("        inverse: rotate by -theta (the inverse rotation, which is the backward).\n", "")
rope_.__doc__ = api.rope_.__doc__
