"""Rotary position embedding (RoPE) of q and k in one launch, the cos / sin gathered by position from a cache."""

from __future__ import annotations

import torch

from deepgemm.api.backend import backend_for
from deepgemm.api.ready_launches import keep
from deepgemm.api.validation import (
    MAX_ROWS,
    refuse_grad_for,
    require_dtype,
    require_output,
    require_rank,
    require_same_device,
    require_tensor,
)
from deepgemm.kernels.rope.launch import rope_cuda
from deepgemm.reference import rope_reference

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
POSITION_DTYPES = (torch.int32, torch.int64)
# Metadata of argument sets that passed check_rope on the kernel path (every shape, stride, dtype and device, the
# pair layout): a warm call with the same metadata skips the checks (~5 us of Python).
_kernel_ready: dict[tuple, bool] = {}
_IN_PLACE_NOT_DIFFERENTIABLE = ("rope_ writes its inputs in place and records no graph; use deepgemm.rope (the "
                                "functional form) for gradients")


def check_rope(q: object, k: object, cos_sin_cache: object, positions: object, interleaved: object,
               where: str = "rope") -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The metadata rules of rope and rope_ (shared with the custom ops' fake kernels)."""
    q_ = require_tensor(q, "q", where)
    require_dtype(q_, "q", where, DTYPES)
    require_rank(q_, "q", where, 3)
    k_ = None
    if k is not None:
        k_ = require_tensor(k, "k", where)
        if k_.dtype != q_.dtype:
            raise TypeError(f"{where}: 'k' must have q's dtype {q_.dtype}, got {k_.dtype}")
        require_rank(k_, "k", where, 3)
        if k_.shape[0] != q_.shape[0]:
            raise ValueError(f"{where}: 'k' must hold q's {q_.shape[0]} tokens (dimension 0), got {k_.shape[0]}")
    cache = require_tensor(cos_sin_cache, "cos_sin_cache", where)
    require_dtype(cache, "cos_sin_cache", where, DTYPES)
    require_rank(cache, "cos_sin_cache", where, 2)
    pos = require_tensor(positions, "positions", where)
    require_dtype(pos, "positions", where, POSITION_DTYPES)
    require_rank(pos, "positions", where, 1)
    if pos.shape[0] != q_.shape[0]:
        raise ValueError(f"{where}: 'positions' must hold one position per token ({q_.shape[0]}), got {pos.shape[0]}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"{where}: 'interleaved' must be a bool, got {type(interleaved).__name__}")
    rotary = cache.shape[1]
    head_dims = {"q": q_.shape[2]} if k_ is None else {"q": q_.shape[2], "k": k_.shape[2]}
    if rotary < 2 or rotary % 2:
        raise ValueError(f"{where}: 'cos_sin_cache' must be [positions, rotary_dim] with an even rotary_dim >= 2 "
                         f"(cos then sin halves), got {rotary} columns")
    for name, dim in head_dims.items():
        if rotary > dim:
            raise ValueError(f"{where}: rotary_dim {rotary} (cos_sin_cache columns) exceeds {name}'s head_dim {dim}")
    rows = q_.shape[0] * (q_.shape[1] + (0 if k_ is None else k_.shape[1]))
    if rows > MAX_ROWS or cache.shape[0] > MAX_ROWS:
        raise ValueError(f"{where}: tokens x heads ({rows}) and cache positions ({cache.shape[0]}) must be below "
                         f"2^31 (the kernel's 32-bit row indices)")
    tensors = {"q": q_, "cos_sin_cache": cache, "positions": pos}
    if k_ is not None:
        tensors["k"] = k_
    require_same_device(where, **tensors)
    return q_, k_, cache, pos


def _ready_key(where: str, q: object, k: object, cache: object, positions: object, interleaved: object) -> tuple | None:
    """The warm-path key of a call, or None where the checks must run (an argument that is not a plain tensor)."""
    if (type(q) is not torch.Tensor or type(cache) is not torch.Tensor or type(positions) is not torch.Tensor
            or type(interleaved) is not bool):
        return None
    if k is None:
        k_key: tuple | None = None
    elif type(k) is torch.Tensor:
        k_key = (k.shape, k.stride(), k.dtype, k.device)
    else:
        return None
    return (where, q.shape, q.stride(), q.dtype, q.device, k_key, cache.shape, cache.stride(), cache.dtype,
            cache.device, positions.shape, positions.stride(), positions.dtype, positions.device, interleaved)


def _checked(where: str, q: object, k: object, cache: object, positions: object, interleaved: object
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, bool, tuple | None]:
    """check_rope, skipped for warm metadata; also whether our kernel serves the call, and the call's warm key where
    its metadata needs no copy (unit feature strides, contiguous positions)."""
    key = _ready_key(where, q, k, cache, positions, interleaved)
    if key is not None and key in _kernel_ready:
        return q, k, cache, positions, True, key  # type: ignore[return-value]
    q_, k_, cache_, positions_ = check_rope(q, k, cache, positions, interleaved, where)
    kernel = backend_for(q_) == "sm90"
    readable = all(t is None or _unit_feature_stride(t) for t in (q_, k_, cache_)) and positions_.is_contiguous()
    if not (kernel and readable):
        key = None
    if key is not None:
        keep(_kernel_ready, key, True)
    return q_, k_, cache_, positions_, kernel, key


def _unit_feature_stride(x: torch.Tensor) -> bool:
    return x.shape[-1] <= 1 or x.stride(-1) == 1


def _readable(x: torch.Tensor) -> torch.Tensor:
    """x with a unit stride along its last dimension (a copy where it has another)."""
    return x if _unit_feature_stride(x) else x.contiguous()


def refuse_cache_grad(where: str, cache: torch.Tensor) -> None:
    """The cos/sin cache gets no gradient: with grad mode on, a cache that requires grad is an error."""
    refuse_grad_for(where, "gradients of the cos/sin cache are not computed (detach it)", {"cos_sin_cache": cache})


def rope(q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor, positions: torch.Tensor, *,
         interleaved: bool = False, inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotary position embedding of q and k (one launch): new tensors, the inputs untouched.

    Token t's cos / sin are row positions[t] of `cos_sin_cache` [P, R]: its first R/2 columns hold cos(theta_p)
    and the last R/2 sin(theta_p) (vLLM's and FlashInfer's layout). The first R features of every head rotate, pair
    p by theta_p: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin in float32, rounded to q's dtype. Pairs are
    (x[p], x[p + R/2]) (interleaved=False: GPT-NeoX, Llama, Qwen, Mixtral) or (x[2p], x[2p + 1]) (interleaved=True:
    GPT-J, DeepSeek-V3's rope dims). Features R.. of a head (partial rotary) pass through unchanged. A position
    outside [0, P) reads nothing and makes that token's rotated features NaN on every path.

    Differentiable in q and k (through the public deepgemm.rope): the backward is the inverse rotation, one launch.

    Args:
        q: float32, bfloat16 or float16 [tokens, heads, head_dim]; any token and head strides (a view of a fused qkv
            projection works as is), a unit stride along head_dim (else copied).
        k: None, or [tokens, kv_heads, head_dim_k] of q's dtype (kv_heads and head_dim_k may differ from q's).
        cos_sin_cache: float32, bfloat16 or float16 [P, R], R even, R <= every head_dim.
        positions: int32 or int64 [tokens].
        interleaved: the pair layout above.
        inverse: rotate by -theta (the inverse rotation, which is the backward).

    Returns:
        (q rotated, k rotated or None): new contiguous tensors of the inputs' shapes.

    Raises:
        TypeError: an argument is not a tensor, a dtype is wrong (k differs from q, positions not int32/int64),
            `interleaved` is not a bool.
        ValueError: a rank is wrong, tokens differ between q, k and positions, R is odd or exceeds a head_dim, tensors
            are on two devices, or sizes pass the kernel's 32-bit indices.
        deepgemm.NotDifferentiableError: `cos_sin_cache` requires grad while grad mode is on.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError, deepgemm.GraphCaptureError: the first
            GPU call of a dtype and layout could not compile, cache or load its kernel.

    Example::

        q = torch.randn(4096, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(4096, 8, 128, device="cuda", dtype=torch.bfloat16)
        inv_freq = 1.0 / 500000 ** (torch.arange(0, 128, 2, device="cuda") / 128)
        angles = torch.outer(torch.arange(8192, device="cuda"), inv_freq)
        cache = torch.cat((angles.cos(), angles.sin()), dim=-1)           # float32 [8192, 128]
        positions = torch.arange(4096, device="cuda")
        q_rot, k_rot = deepgemm.rope(q, k, cache, positions)
    """
    q, k, cache, positions, kernel, warm = _checked("rope", q, k, cos_sin_cache, positions, interleaved)
    if not isinstance(inverse, bool):
        raise TypeError(f"rope: 'inverse' must be a bool, got {type(inverse).__name__}")
    refuse_cache_grad("rope", cache)
    if not kernel:
        return (rope_reference(q, cache, positions, interleaved, inverse).contiguous(),
                None if k is None else rope_reference(k, cache, positions, interleaved, inverse).contiguous())
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = None if k is None else torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q.shape[0] == 0:
        return q_out, k_out
    if warm is None:  # (a warm call's tensors need no copy)
        q, k, cache, positions = _readable(q), None if k is None else _readable(k), _readable(cache), \
            positions.contiguous()
    rope_cuda(q, q_out, k, k_out, cache, positions, interleaved, inverse, warm)
    return q_out, k_out


def rope_(q: torch.Tensor, k: torch.Tensor | None, cos_sin_cache: torch.Tensor, positions: torch.Tensor, *,
          interleaved: bool = False) -> None:
    """deepgemm.rope in place: q (and k) are overwritten with their rotation; features past rotary_dim are not
    touched. One launch, no allocation (CUDA-graph friendly).

    Args:
        q, k, cos_sin_cache, positions, interleaved: as deepgemm.rope, except that q and k must have a unit stride
            along head_dim, hold one element per memory location, and share no element with each other (q and k
            may be views of one fused qkv tensor).

    Raises:
        As deepgemm.rope, and ValueError: q or k has a non-unit head_dim stride, overlaps itself, is the same tensor
            as the other, or is an inference tensor outside inference mode. deepgemm.NotDifferentiableError: q, k or
            the cache requires grad while grad mode is on (use deepgemm.rope).

    Example::

        qkv = torch.randn(4096, (32 + 2 * 8) * 128, device="cuda", dtype=torch.bfloat16)
        q, k, v = qkv.split([32 * 128, 8 * 128, 8 * 128], dim=-1)
        deepgemm.rope_(q.view(4096, 32, 128), k.view(4096, 8, 128), cache, positions)   # rotates qkv in place
    """
    where = "rope_"
    q, k, cache, positions, kernel, warm = _checked(where, q, k, cos_sin_cache, positions, interleaved)
    check_rope_in_place(q, k, where)
    _require_distinct(q, k, where)
    refuse_grad_for(where, _IN_PLACE_NOT_DIFFERENTIABLE, {"q": q, "k": k})
    refuse_cache_grad(where, cache)
    if q.shape[0] == 0:
        return
    if not kernel:
        q.copy_(rope_reference(q, cache, positions, interleaved))
        if k is not None:
            k.copy_(rope_reference(k, cache, positions, interleaved))
        return
    if warm is None:
        cache, positions = _readable(cache), positions.contiguous()
    rope_cuda(q, q, k, k, cache, positions, interleaved, False, warm)


def check_rope_in_place(q: torch.Tensor, k: torch.Tensor | None, where: str = "rope_") -> None:
    """rope_'s metadata rules on the tensors it writes (shared with its fake kernel)."""
    for name, t in (("q", q), ("k", k)):
        if t is None:
            continue
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{where}: '{name}' must have a unit stride along head_dim to be rotated in place, got "
                             f"strides {t.stride()}")
        require_output(t, name, where)


def _require_distinct(q: torch.Tensor, k: torch.Tensor | None, where: str) -> None:
    """q and k do not start at one address (the memory rule of the eager path; fake tensors have no memory)."""
    if k is not None and q.numel() and k.numel() and q.data_ptr() == k.data_ptr():
        raise ValueError(f"{where}: 'q' and 'k' start at the same address; in place they must share no element")
