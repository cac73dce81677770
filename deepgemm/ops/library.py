"""The `deepgemm` torch.library namespace: one schema, CPU and CUDA kernels and a fake (meta) kernel per op.

Schemas follow what every supported torch (>= 2.9) accepts: functional ops return new tensors, `_out` ops mutate
`out` and return nothing, accumulate ops mutate `c` and return nothing; no op returns a mutated input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from collections.abc import Sequence

from deepgemm.api.kgrouped import ks_entry
from deepgemm.api.validation import require_pair, require_rank, require_tensor

NAMESPACE = "deepgemm"
LIBRARY = torch.library.Library(NAMESPACE, "DEF")  # kept alive for the process: dropping it unregisters the ops


def define(schema: str, impl: Callable[..., Any], fake: Callable[..., Any]) -> None:
    """Register `schema` with `impl` for CPU and CUDA tensors (it picks the kernel or the reference path itself)
    and `fake` for tracing (shapes, dtypes and the same argument rules; no device work)."""
    name = schema.split("(", 1)[0]
    LIBRARY.define(schema)
    LIBRARY.impl(name, impl, "CPU")
    LIBRARY.impl(name, impl, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=LIBRARY)


def compiling() -> bool:
    """True while Dynamo (torch.compile, torch.export) traces: public functions then call the custom ops so the
    graph holds `torch.ops.deepgemm.*` nodes; eager calls go straight to the implementation (host time)."""
    return torch.compiler.is_compiling()


OUT_DTYPES = (torch.bfloat16, torch.float32)


def empty_out(shape: tuple[int, ...], dtype: torch.dtype | None, like: torch.Tensor) -> torch.Tensor:
    """A functional op's new output on `like`'s device (dtype None: bfloat16)."""
    dtype = torch.bfloat16 if dtype is None else dtype
    if dtype not in OUT_DTYPES:
        raise TypeError(f"'out_dtype' must be torch.bfloat16 or torch.float32, got {dtype}")
    return torch.empty(shape, dtype=dtype, device=like.device)


def require_ranks(where: str, *operands: tuple[str, object, int]) -> None:
    """The ranks of the (name, tensor, rank) operands a functional op computes its output's shape from, checked
    before that shape is (a wrong rank raises the public function's ValueError, not an IndexError)."""
    for name, tensor, rank in operands:
        require_rank(require_tensor(tensor, name, where), name, where, rank)


def traced_pairs(where: str, a: object, b: object) -> tuple[tuple[torch.Tensor, torch.Tensor],
                                                             tuple[torch.Tensor, torch.Tensor]]:
    """The (fp8 tensor, scales) pairs `a` and `b` of a traced call, with the eager path's rule (a pair each)."""
    return require_pair(a, "a", where), require_pair(b, "b", where)


def traced_ks(where: str, ks: object) -> list[int]:
    """A traced k-grouped call's ks as ints, with the eager path's type rules (its values are checked by the fake
    kernel). A tensor's values cannot be traced: under torch.compile ks must be a list or tuple of ints."""
    if not isinstance(ks, Sequence) or isinstance(ks, (str, bytes)):
        raise TypeError(f"{where}: under torch.compile 'ks' must be a list or tuple of ints (tokens per group; a "
                        f"tensor's values cannot be traced), got {type(ks).__name__}")
    return [ks_entry(value, g, where) for g, value in enumerate(ks)]


def refuse_validate_when_compiling(where: str) -> None:
    raise ValueError(f"{where}: 'validate=True' reads the grouping tensor on the host, which torch.compile cannot "
                     "trace; call deepgemm.check_grouped_layout eagerly before the compiled region instead")
