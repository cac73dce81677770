"""Tensor-parallel linear layers trained through FP8 GEMMs (Megatron-style, on `deepgemm.fp8_linear`).

`ColumnParallelFp8TrainingLinear` holds rows [r*n, (r+1)*n) of the weight (output features) and its bias part;
`RowParallelFp8TrainingLinear` holds columns [r*k, (r+1)*k) (input features) and the whole bias. The parameters are
this rank's slices in your precision (the optimizer's master copy); every GEMM of a step, forward and backward, is
`fp8_linear`'s FP8 GEMM on this rank's shard. The collectives are autograd functions of ours on torch.distributed
(NCCL on GPUs, gloo on CPUs): the column layer's input gradient and the row layer's output are all-reduced in
float32 (the row layer's float32 partial sums are then rounded once; each rank's dx is in x's dtype already).
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from deepgemm.distributed.comm import gather_columns
from deepgemm.distributed.sharding import group_size_rank, shard_bounds
from deepgemm.nn.training import Fp8TrainingGemm
from deepgemm.ops.fp8_linear import fp8_linear


def _all_reduce_float32(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The sum of `t` over the group, reduced in float32 and returned in t's dtype."""
    total = t.to(torch.float32, copy=True).contiguous()
    dist.all_reduce(total, group=group)
    return total.to(t.dtype)


class _CopyToGroup(torch.autograd.Function):
    """Forward: the replicated input as it is. Backward: the ranks' partial input gradients summed."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce_float32(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    """Forward: the ranks' partial outputs summed. Backward: the (replicated) gradient as it is."""

    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        return _all_reduce_float32(partial, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherColumns(torch.autograd.Function):
    """Forward: [M, n] per rank -> [M, tp*n] in rank order. Backward: this rank's n columns of the gradient."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, group: dist.ProcessGroup, tp_size: int, rank: int) -> torch.Tensor:
        ctx.n, ctx.rank = y.shape[-1], rank
        return gather_columns(y, group, tp_size)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return grad[..., ctx.rank * ctx.n:(ctx.rank + 1) * ctx.n], None, None, None


class _SplitColumns(torch.autograd.Function):
    """Forward: this rank's k columns of the replicated input. Backward: the ranks' column gradients gathered."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, tp_size: int, rank: int) -> torch.Tensor:
        k = x.shape[-1] // tp_size
        ctx.group, ctx.tp_size = group, tp_size
        return x[..., rank * k:(rank + 1) * k].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return gather_columns(grad.contiguous(), ctx.group, ctx.tp_size), None, None, None


_Layer = TypeVar("_Layer", bound="_ParallelFp8TrainingLinear")


class _ParallelFp8TrainingLinear(nn.Module):
    """The shard, the group and the parameters both layers share."""

    shard_dim: int  # 0: rows (output features, column-parallel); 1: columns (input features, row-parallel)

    def __init__(self, in_features: int, out_features: int, bias: bool, group: dist.ProcessGroup | None,
                 device: torch.device | str | None, dtype: torch.dtype | None) -> None:
        super().__init__()
        name = f"{type(self).__name__}(in_features={in_features}, out_features={out_features})"
        self.group, self.tp_size, self.tp_rank = group_size_rank(group, name)
        split = out_features if self.shard_dim == 0 else in_features
        self.shard = shard_bounds(split, self.tp_size, self.tp_rank, layer=name,
                                  dim="out_features" if self.shard_dim == 0 else "in_features")
        local = self.shard[1] - self.shard[0]
        self.full_in_features, self.full_out_features = in_features, out_features
        self.in_features, self.out_features = (in_features, local) if self.shard_dim == 0 else (local, out_features)
        for feature, size in (("in_features", self.in_features), ("out_features", self.out_features)):
            if size % 16:
                raise ValueError(f"{name}: this rank's {feature}={size} must be a multiple of 16 (the FP8 GEMMs read "
                                 "it as a reduction dimension in 16-byte rows)")
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty((self.out_features, self.in_features), **factory))  # type: ignore[arg-type]
        bias_size = self.out_features if self.shard_dim == 0 else out_features
        self.bias = nn.Parameter(torch.empty(bias_size, **factory)) if bias else None  # type: ignore[arg-type]
        self.reset_parameters()

    @classmethod
    def _shard_of(cls: type[_Layer], linear: nn.Linear, group: dist.ProcessGroup | None, **options: bool) -> _Layer:
        """This rank's shard of a whole nn.Linear (copied, on its device and in its dtype); `options`: the layer's
        own (gather_output, input_is_parallel)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group=group, device="meta",
                    dtype=linear.weight.dtype, **options)
        layer.to_empty(device=linear.weight.device)
        layer.load_full(linear.weight.detach(), None if linear.bias is None else linear.bias.detach())
        return layer

    def reset_parameters(self) -> None:
        """nn.Linear's initialization of the whole layer (the same on every rank under the same seed), sliced: a
        TP run starts from the weights a single-process run has. A no-op on the meta device (call it after
        to_empty)."""
        if self.weight.is_meta:
            return
        full = nn.Linear(self.full_in_features, self.full_out_features, self.bias is not None,
                         device=self.weight.device, dtype=self.weight.dtype)
        self.load_full(full.weight, full.bias)

    @torch.no_grad()
    def load_full(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Copy this rank's slice of the whole layer's weight [full_out, full_in] (and bias [full_out]) into the
        parameters (converted to their dtype)."""
        where = f"{type(self).__name__}.load_full"
        full = (self.full_out_features, self.full_in_features)
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != full:
            got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ValueError(f"{where}: 'weight' must be the whole layer's {full}, got {got}")
        start, stop = self.shard
        self.weight.copy_(weight[start:stop] if self.shard_dim == 0 else weight[:, start:stop])
        if self.bias is None and bias is not None:
            raise ValueError(f"{where}: the layer has no bias, but 'bias' was given")
        if self.bias is not None:
            if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (self.full_out_features,):
                raise ValueError(f"{where}: the layer has a bias: 'bias' must be [{self.full_out_features}]")
            self.bias.copy_(bias[start:stop] if self.shard_dim == 0 else bias)

    def _check_input(self, x: torch.Tensor, features: int) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != features:
            got = x.shape[-1] if x.dim() else "no"
            raise ValueError(f"{type(self).__name__}: input has {got} features in its last dimension, expected "
                             f"{features}")
        return x.reshape(-1, features)

    def fp8_training_gemm(self) -> Fp8TrainingGemm:
        """This rank's GEMM shape (precompile_model plans its kernels): the row-parallel layer's partial sums are
        float32 with more than one rank."""
        partial = self.shard_dim == 1 and self.tp_size > 1
        return Fp8TrainingGemm(self.out_features, self.in_features, self.weight.dtype,
                               torch.float32 if partial else None)

    def extra_repr(self) -> str:
        return (f"in_features={self.full_in_features}, out_features={self.full_out_features}, "
                f"shard={self.shard}, tp_size={self.tp_size}, bias={self.bias is not None}")


class ColumnParallelFp8TrainingLinear(_ParallelFp8TrainingLinear):
    """y = x W^T (+ bias) with W [out_features, in_features] split by rows over `group`, trained in FP8: rank r holds
    rows [r*n, (r+1)*n), n = out_features / tp_size (out_features a multiple of 128 * tp_size, as for
    ColumnParallelFp8Linear), and that part of the bias. The input is replicated; the output is this rank's n
    columns, or with gather_output=True all of them (all-gathered; the backward keeps this rank's columns of the
    gradient). The backward all-reduces the input gradient (each rank's dx is its shard's part of dy W).

    Args:
        in_features / out_features: the whole layer's shape; in_features and n multiples of 16.
        bias: whether the layer has a bias (this rank keeps its part).
        group: a torch.distributed process group (default: the world).
        gather_output: return the whole output instead of this rank's columns.
        device / dtype: the parameters' (your master precision; default torch's).

    Raises:
        RuntimeError: torch.distributed is not initialized.
        ValueError: out_features is not a multiple of 128 * tp_size (more than one rank), a shard dimension is not a
            multiple of 16, or this process is not in `group`; in a call, the input's last dimension is not
            in_features, or what deepgemm.fp8_linear raises.

    Example::

        from deepgemm.distributed import ColumnParallelFp8TrainingLinear, RowParallelFp8TrainingLinear

        up = ColumnParallelFp8TrainingLinear(4096, 14336, bias=False, device="cuda")    # FP32 master weights
        down = RowParallelFp8TrainingLinear(14336, 4096, bias=False, device="cuda")     # takes up's columns
        loss = down(torch.nn.functional.gelu(up(x))).float().square().mean()
        loss.backward()                                  # every GEMM in FP8; dx all-reduced over the group
    """

    shard_dim = 0

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 group: dist.ProcessGroup | None = None, gather_output: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(in_features, out_features, bias, group, device, dtype)
        self.gather_output = bool(gather_output)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: dist.ProcessGroup | None = None, *,
                    gather_output: bool = False) -> ColumnParallelFp8TrainingLinear:
        """This rank's shard of a whole nn.Linear (copied, on its device and in its dtype)."""
        return cls._shard_of(linear, group, gather_output=gather_output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self._check_input(x, self.in_features)
        if self.tp_size > 1:
            rows = _CopyToGroup.apply(rows, self.group)
        y = fp8_linear(rows, self.weight, self.bias)
        if self.gather_output and self.tp_size > 1:
            y = _GatherColumns.apply(y, self.group, self.tp_size, self.tp_rank)
            return y.reshape(*x.shape[:-1], self.full_out_features)
        return y.reshape(*x.shape[:-1], self.out_features)


class RowParallelFp8TrainingLinear(_ParallelFp8TrainingLinear):
    """y = x W^T (+ bias) with W [out_features, in_features] split by columns over `group`, trained in FP8: rank r
    holds columns [r*k, (r+1)*k), k = in_features / tp_size (in_features a multiple of 128 * tp_size with more than
    one rank), and the whole bias. With more than one rank each GEMM gives a float32 partial sum, all-reduced in
    float32; the bias is added and the sum rounded once to x's dtype (one rank: fp8_linear itself).
    input_is_parallel (default True): the input is this rank's k features (a
    ColumnParallelFp8TrainingLinear's output without gather_output); False: the whole input, of which the layer takes
    its k columns (and all-gathers the input gradient's columns in the backward). The bias gradient is the same on
    every rank (it is computed from the replicated output gradient).

    Args:
        in_features / out_features: the whole layer's shape; k and out_features multiples of 16.
        bias: whether the layer has a bias (kept whole on every rank).
        group / device / dtype: as for ColumnParallelFp8TrainingLinear.
        input_is_parallel: see above.

    Raises:
        RuntimeError: torch.distributed is not initialized.
        ValueError: in_features is not a multiple of 128 * tp_size (more than one rank), a shard dimension is not a
            multiple of 16, or this process is not in `group`; in a call, the input's last dimension is not the
            expected one, or what deepgemm.fp8_linear raises.

    Example::

        from deepgemm.distributed import RowParallelFp8TrainingLinear

        down = RowParallelFp8TrainingLinear.from_linear(torch.nn.Linear(14336, 4096, device="cuda"))
        y = down(h_local)                 # h_local: this rank's [T, 14336 / tp_size] columns -> [T, 4096], summed
        y.sum().backward()                # down.weight.grad: this rank's [4096, 14336 / tp_size] in FP32
    """

    shard_dim = 1

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 group: dist.ProcessGroup | None = None, input_is_parallel: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(in_features, out_features, bias, group, device, dtype)
        self.input_is_parallel = bool(input_is_parallel)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: dist.ProcessGroup | None = None, *,
                    input_is_parallel: bool = True) -> RowParallelFp8TrainingLinear:
        """This rank's shard of a whole nn.Linear (copied, on its device and in its dtype)."""
        return cls._shard_of(linear, group, input_is_parallel=input_is_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.in_features if self.input_is_parallel else self.full_in_features
        rows = self._check_input(x, features)
        if not self.input_is_parallel and self.tp_size > 1:
            rows = _SplitColumns.apply(rows, self.group, self.tp_size, self.tp_rank)
        if self.tp_size == 1:
            y = fp8_linear(rows, self.weight, self.bias)
        else:
            total = _ReduceFromGroup.apply(fp8_linear(rows, self.weight, out_dtype=torch.float32), self.group)
            if self.bias is not None:  # added before the one rounding, as the single layer's GEMM output does
                total = total + self.bias.to(torch.float32)
            y = total.to(rows.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)
