"""Tensor-parallel FP8 linear layers (Megatron-style): `ColumnParallelFp8Linear` shards the weight by N (output
features), `RowParallelFp8Linear` by K (input features); both keep the 128x128 block scales whole on every rank.

Each is an `Fp8Linear` holding this rank's shard: `weight` e4m3 [out_features, in_features] and `weight_scale_inv`
float32 [ceil(out_features/128), ceil(in_features/128)] are the shard's, so `in_features` / `out_features` are the
shard's GEMM shape (what `route`, `backend()` and `precompile_model` see) and `full_in_features` /
`full_out_features` the whole layer's. Inference only, eager mode: the collectives are issued from Python.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from deepgemm.api.linear import fp8_linear
from deepgemm.distributed.comm import (
    all_reduce_async,
    chunk_bounds,
    gather_columns,
    gathered_chunks,
    reduce_scatter_async,
)
from deepgemm.distributed.sharding import (
    check_chunks,
    check_num_sms,
    group_size_rank,
    scale_bounds,
    shard_bounds,
)
from deepgemm.nn.linear import BLOCK, FP8, OUT_DTYPES, Fp8Linear
from deepgemm.ops import fp8_gemm_nt, quantize_per_token_group
from deepgemm.ops.library import compiling
from deepgemm.utils import ceil_div


class _ParallelFp8Linear(Fp8Linear):
    """What both layers share: the shard, the process group, the GEMM call site."""

    shard_dim: int  # the weight dimension split over the ranks: 0 (N, column-parallel) or 1 (K, row-parallel)
    group: dist.ProcessGroup

    def __init__(self, in_features: int, out_features: int, bias: bool, *, group: dist.ProcessGroup | None,
                 chunks: int, num_sms: int | None, device: torch.device | str | None, dtype: torch.dtype) -> None:
        name = f"{type(self).__name__}(in_features={in_features}, out_features={out_features})"
        resolved, tp_size, rank = group_size_rank(group, name)
        split = out_features if self.shard_dim == 0 else in_features
        start, stop = shard_bounds(split, tp_size, rank, layer=name,
                                   dim="out_features" if self.shard_dim == 0 else "in_features")
        local_out, local_in = (stop - start, in_features) if self.shard_dim == 0 else (out_features, stop - start)
        super().__init__(local_in, local_out, bias, device=device, dtype=dtype)
        self.full_in_features, self.full_out_features = in_features, out_features
        self.group, self.tp_size, self.tp_rank = resolved, tp_size, rank
        self.shard = (start, stop)  # this rank's rows (column-parallel) or columns (row-parallel) of the full weight
        self.chunks = check_chunks(chunks, name)
        self.num_sms = check_num_sms(num_sms, name)

    # ------------------------------------------------------------------------------------------------ loading

    def shard_index(self) -> tuple[int, tuple[int, int], tuple[int, int]]:
        """(the split dimension, this rank's [start, stop) of the full weight along it, the same of the full
        weight_scale_inv)."""
        return self.shard_dim, self.shard, scale_bounds(*self.shard)

    @torch.no_grad()
    def load_full_fp8_weight(self, weight: torch.Tensor, scale_inv: torch.Tensor,
                             bias: torch.Tensor | None = None) -> None:
        """Keep this rank's slice of the whole layer's e4m3 weight [full_out, full_in], its block scales
        [ceil(full_out/128), ceil(full_in/128)] and (when the layer has one) its bias [full_out]."""
        where = f"{type(self).__name__}.load_full_fp8_weight"
        full = (self.full_out_features, self.full_in_features)
        scales = (ceil_div(full[0], BLOCK), ceil_div(full[1], BLOCK))
        if not isinstance(weight, torch.Tensor) or weight.dtype != FP8 or tuple(weight.shape) != full:
            got = f"{weight.dtype} {tuple(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ValueError(f"{where}: 'weight' must be the full layer's float8_e4m3fn {full}, got {got}")
        if not isinstance(scale_inv, torch.Tensor) or tuple(scale_inv.shape) != scales:
            got = str(tuple(scale_inv.shape)) if isinstance(scale_inv, torch.Tensor) else type(scale_inv).__name__
            raise ValueError(f"{where}: 'scale_inv' must be the full layer's block scales {scales}, got {got}")
        dim, (start, stop), (s_start, s_stop) = self.shard_index()
        self.load_fp8_weight(weight.narrow(dim, start, stop - start), scale_inv.narrow(dim, s_start, s_stop - s_start))
        if bias is not None and self.bias is not None:
            if tuple(bias.shape) != (self.full_out_features,):
                raise ValueError(f"{where}: 'bias' must have shape ({self.full_out_features},), got "
                                 f"{tuple(bias.shape)}")
            self.bias.copy_(self.bias_shard(bias))

    def bias_shard(self, bias: torch.Tensor) -> torch.Tensor:
        """This rank's part of the full layer's bias (all of it for row-parallel, which adds it once, after the
        reduction)."""
        return bias

    @staticmethod
    def _full_layer(layer: Fp8Linear, where: str) -> Fp8Linear:
        if not isinstance(layer, Fp8Linear) or isinstance(layer, _ParallelFp8Linear):
            raise TypeError(f"{where}: expects an (unsharded) Fp8Linear, got {type(layer).__name__}")
        if layer.weight.is_meta:
            raise ValueError(f"{where}: the layer is on the meta device (it holds no weight to shard)")
        return layer

    # ------------------------------------------------------------------------------------------------ compute

    def _gemm(self, q: torch.Tensor, sf: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """The FP8 GEMM of quantized activation rows with this rank's weight shard (eager `_linear` calls run the
        same GEMM through fp8_linear, with the same cap). It runs on at most `self.num_sms` SMs (None: all of them,
        under DEEPGEMM_NUM_SMS), so a collective issued around it keeps the rest; the cap is part of the GEMM's
        launch-ready key."""
        return fp8_gemm_nt((q, sf), (self.weight, self.weight_scale_inv), out_dtype=out_dtype, num_sms=self.num_sms)

    def _linear(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """rows [m, in_features] (high precision) -> [m, out_features] in `out_dtype`, no bias: quantize + FP8
        GEMM, or the routed matmul of the dequantized shard (route "bf16"), as Fp8Linear does."""
        if self.route == "bf16":
            weight = self.weight_dequantized
            assert weight is not None, "refresh() builds it with the weight"
            rows = x.to(self.out_dtype)  # the input the single layer's matmul reads
            if out_dtype != weight.dtype:  # a float32 partial for a float32 reduction: no rounding before the sum
                return F.linear(rows.to(out_dtype), weight.to(out_dtype))
            return F.linear(rows, weight)
        if x.shape[0] == 0:
            return torch.zeros((0, self.out_features), dtype=out_dtype, device=x.device)
        if not compiling():  # the same two kernels through one launch-ready path (host time)
            return fp8_linear(x, self.weight, self.weight_scale_inv, out_dtype, self.num_sms)
        return self._gemm(*quantize_per_token_group(x, BLOCK), out_dtype)

    def _add_bias(self, y: torch.Tensor) -> torch.Tensor:
        return y.add_(self.bias) if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"full_in_features={self.full_in_features}, full_out_features={self.full_out_features}, "
                f"tp_size={self.tp_size}, tp_rank={self.tp_rank}, shard={self.shard}, chunks={self.chunks}, "
                f"num_sms={self.num_sms}, " + super().extra_repr())


class ColumnParallelFp8Linear(_ParallelFp8Linear):
    """y = x W^T (+ bias) with W [out_features, in_features] split by rows (output features) over `group`: rank r
    holds rows [r*n, (r+1)*n), n = out_features / tp_size, and their 128-row blocks of scales, so out_features must
    be a multiple of 128 * tp_size (one rank: any). Output: [..., n], this rank's columns of y, or with
    gather_output=True all of y ([..., out_features], all-gathered).

    sequence_parallel=True: the input is this rank's share of the rows (sequence-parallel activations, sharded
    along their first dimension: sequence-first [s/tp, b, in] or tokens [T/tp, in]); the layer quantizes them to FP8
    (1x128 scales), all-gathers the FP8 bytes and the scales (about 0.52 of the BF16 bytes) in `chunks` pieces along
    M and runs the GEMM of each piece as soon as it lands, while the later pieces are still in flight. Output:
    [tp*s, ..., n], the rows of every rank in rank order. chunks=1 is the non-overlapped baseline (gather, then one
    GEMM). The best chunk count is a measurement on the GPUs (none was made yet); any count gives the same result.

    num_sms: the most SMs each FP8 GEMM of the layer may occupy (`fp8_gemm_nt(num_sms=)`: its persistent grid and
    tile choice are planned for that many), so the NCCL kernels of the overlapped collectives keep the others;
    None (default): every SM (under DEEPGEMM_NUM_SMS). From 1 to the GPU's SM count (checked at the first call);
    the routed BF16 matmul (route "bf16") ignores it. The best cap is a measurement on the GPUs (none was made
    yet). group: a torch.distributed process group (default: the world).

    Args:
        in_features / out_features: the whole layer's shape (this rank holds out_features / tp_size rows).
        bias: whether the layer has a bias (this rank keeps its part).
        group / gather_output / sequence_parallel / chunks / num_sms: see above.
        device / dtype: as for Fp8Linear (dtype: the output and bias dtype, bfloat16 or float32).

    Raises:
        RuntimeError: torch.distributed is not initialized.
        TypeError: `group` is not a ProcessGroup, or `dtype` is not bfloat16/float32.
        ValueError: out_features is not a multiple of 128 * tp_size (with more than one rank), this process is
            not in `group`, gather_output and sequence_parallel are both set, chunks != 1 without
            sequence_parallel, or `chunks` / `num_sms` / a feature count is not a positive int. In a call: the
            input's last dimension is not in_features.

    Example::

        from deepgemm.distributed import ColumnParallelFp8Linear

        torch.distributed.init_process_group("nccl")            # one process per GPU (torchrun)
        torch.cuda.set_device(torch.distributed.get_rank() % torch.cuda.device_count())
        up = ColumnParallelFp8Linear.from_linear(torch.nn.Linear(7168, 18432, device="cuda", dtype=torch.bfloat16))
        y = up(torch.randn(16, 7168, device="cuda", dtype=torch.bfloat16))   # [16, 18432 / tp_size]
    """

    shard_dim = 0

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 group: dist.ProcessGroup | None = None, gather_output: bool = False, sequence_parallel: bool = False,
                 chunks: int = 1, num_sms: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        name = type(self).__name__
        if gather_output and sequence_parallel:
            raise ValueError(f"{name}: gather_output and sequence_parallel exclude each other (a sequence-parallel "
                             f"column layer feeds a row-parallel one, which reduce-scatters)")
        if not sequence_parallel and chunks != 1:
            raise ValueError(f"{name}: chunks={chunks!r} needs sequence_parallel=True (only the sequence-parallel "
                             f"all-gather of the input is chunked)")
        super().__init__(in_features, out_features, bias, group=group, chunks=chunks, num_sms=num_sms,
                         device=device, dtype=dtype)
        self.gather_output, self.sequence_parallel = bool(gather_output), bool(sequence_parallel)

    @classmethod
    def from_fp8_linear(cls, layer: Fp8Linear, group: dist.ProcessGroup | None = None, *,
                        gather_output: bool = False, sequence_parallel: bool = False, chunks: int = 1,
                        num_sms: int | None = None) -> ColumnParallelFp8Linear:
        """This rank's shard of a whole (unsharded) Fp8Linear, on its device and with its output dtype."""
        full = cls._full_layer(layer, f"{cls.__name__}.from_fp8_linear")
        module = cls(full.in_features, full.out_features, full.bias is not None, group=group,
                     gather_output=gather_output, sequence_parallel=sequence_parallel, chunks=chunks,
                     num_sms=num_sms, device=full.weight.device, dtype=full.out_dtype)
        module.load_full_fp8_weight(full.weight, full.weight_scale_inv, full.bias)
        module.train(full.training)
        return module

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, dtype: torch.dtype | None = None,
                    group: dist.ProcessGroup | None = None, gather_output: bool = False,
                    sequence_parallel: bool = False, chunks: int = 1,
                    num_sms: int | None = None) -> ColumnParallelFp8Linear:
        """Quantize a whole nn.Linear per 128x128 block (as Fp8Linear.from_linear, on every rank) and keep this
        rank's shard."""
        return cls.from_fp8_linear(Fp8Linear.from_linear(linear, dtype=dtype), group, gather_output=gather_output,
                                   sequence_parallel=sequence_parallel, chunks=chunks, num_sms=num_sms)

    def bias_shard(self, bias: torch.Tensor) -> torch.Tensor:
        """This rank's part of the full layer's bias: its out_features slice."""
        start, stop = self.shard
        return bias[start:stop]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        name = type(self).__name__
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{name}: input has {x.shape[-1]} features in its last dimension, expected "
                             f"{self.in_features}")
        rows = x.reshape(-1, self.in_features)
        if not self.sequence_parallel:
            y = self._add_bias(self._linear(rows, self.out_dtype))
            if self.gather_output and self.tp_size > 1:
                return gather_columns(y, self.group, self.tp_size).reshape(*x.shape[:-1], self.full_out_features)
            return y.reshape(*x.shape[:-1], self.out_features)
        if x.dim() < 2:
            raise ValueError(f"{name}: a sequence-parallel input needs its sharded (sequence or token) dimension "
                             f"first, got shape {tuple(x.shape)}")
        return self._add_bias(self._gather_and_gemm(rows)).reshape(
            self.tp_size * x.shape[0], *x.shape[1:-1], self.out_features)

    def _gather_and_gemm(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's rows [m, K] -> [tp*m, n]: the chunked all-gather pipelined with the GEMM."""
        m, n, tp = rows.shape[0], self.out_features, self.tp_size
        fp8 = self.route == "fp8" and m > 0
        if fp8:
            q, sf = quantize_per_token_group(rows, BLOCK)
            parts = [q, sf.contiguous()]  # row-major scales: each chunk's rows are one contiguous block
        else:
            parts = [rows.to(self.out_dtype)]
        out = torch.empty((tp * m, n), dtype=self.out_dtype, device=rows.device)
        for offset, size, gathered in gathered_chunks(parts, self.chunks, self.group, tp):
            if fp8:
                y = self._gemm(gathered[0], gathered[1], self.out_dtype)
            else:
                y = self._linear(gathered[0], self.out_dtype)
            if size == m:
                out = y  # one chunk: already in rank order
            else:
                out.view(tp, m, n)[:, offset:offset + size].copy_(y.view(tp, size, n))
        return out

    def extra_repr(self) -> str:
        return (f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel}, "
                + super().extra_repr())


class RowParallelFp8Linear(_ParallelFp8Linear):
    """y = x W^T (+ bias) with W [out_features, in_features] split by columns (input features) over `group`: rank r
    holds columns [r*k, (r+1)*k), k = in_features / tp_size, and their 128-column blocks of scales, so in_features
    must be a multiple of 128 * tp_size (one rank: any). Each rank's GEMM gives a partial sum [M, out_features] in
    `reduce_dtype`, which is all-reduced over the group, cast to the output dtype, and the bias (kept whole on every
    rank) added once. reduce_dtype=torch.float32 (default) rounds once, after the sum, as the single-GPU layer
    does (on the routed path too: float32 partials of the BF16 input, the bias added before the rounding, as the
    single layer's matmul adds it): within calc_diff 3e-6 of the float64 reference at TP 2-8 (CPU runs).
    torch.bfloat16 moves half the bytes but rounds every partial sum: the error grows with the TP size (calc_diff
    about 1e-5 at TP 8), past the 1e-5 target; which one to serve with is for the GPU measurement to settle.

    input_is_parallel (default True): the input is this rank's k features (the output of a ColumnParallelFp8Linear
    without gather_output); False: the whole input [..., in_features], of which the layer takes its k columns.
    chunks > 1: the partial sums are computed in `chunks` pieces along M and each piece's all-reduce starts as soon
    as its GEMM is done, overlapping the next GEMM.

    sequence_parallel=True: the sums are reduce-scattered instead: each rank gets its share of the rows (the first
    dimension, which must divide by tp_size): [s/tp, ..., out_features]. With chunks > 1, each rank's share of
    the rows is split into `chunks` pieces; piece c (the c-th piece of every rank's share, one GEMM) is
    reduce-scattered as soon as its GEMM is done, while the GEMM of piece c+1 runs. chunks=1 is the non-overlapped
    baseline (one GEMM, then one reduce-scatter); the best count is a measurement on the GPUs (none was made yet).

    num_sms, group: as for ColumnParallelFp8Linear.

    Args:
        in_features / out_features: the whole layer's shape (this rank holds in_features / tp_size columns).
        bias: whether the layer has a bias (kept whole on every rank, added once after the reduction).
        group / input_is_parallel / sequence_parallel / chunks / reduce_dtype / num_sms: see above.
        device / dtype: as for Fp8Linear (dtype: the output and bias dtype, bfloat16 or float32).

    Raises:
        RuntimeError: torch.distributed is not initialized.
        TypeError: `group` is not a ProcessGroup, or `dtype` / `reduce_dtype` is not bfloat16/float32.
        ValueError: in_features is not a multiple of 128 * tp_size (with more than one rank), this process is
            not in `group`, or `chunks` / `num_sms` / a feature count is not a positive int. In a call: the
            input's last dimension is not the expected one, or (sequence_parallel) its first dimension does not
            divide by tp_size.

    Example::

        from deepgemm.distributed import ColumnParallelFp8Linear, RowParallelFp8Linear

        up = ColumnParallelFp8Linear(7168, 18432, bias=False, device="cuda")
        down = RowParallelFp8Linear(18432, 7168, bias=False, device="cuda")   # takes up's output shard
        y = down(up(x))                                                        # all-reduced [..., 7168]
    """

    shard_dim = 1

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 group: dist.ProcessGroup | None = None, input_is_parallel: bool = True,
                 sequence_parallel: bool = False, chunks: int = 1, reduce_dtype: torch.dtype = torch.float32,
                 num_sms: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        name = type(self).__name__
        if reduce_dtype not in OUT_DTYPES:
            raise TypeError(f"{name}: 'reduce_dtype' must be torch.float32 or torch.bfloat16, got {reduce_dtype}")
        checked = reduce_dtype
        super().__init__(in_features, out_features, bias, group=group, chunks=chunks, num_sms=num_sms,
                         device=device, dtype=dtype)
        self.input_is_parallel, self.sequence_parallel = bool(input_is_parallel), bool(sequence_parallel)
        self.reduce_dtype = checked

    @classmethod
    def from_fp8_linear(cls, layer: Fp8Linear, group: dist.ProcessGroup | None = None, *,
                        input_is_parallel: bool = True, sequence_parallel: bool = False, chunks: int = 1,
                        reduce_dtype: torch.dtype = torch.float32,
                        num_sms: int | None = None) -> RowParallelFp8Linear:
        """This rank's shard of a whole (unsharded) Fp8Linear, on its device and with its output dtype."""
        full = cls._full_layer(layer, f"{cls.__name__}.from_fp8_linear")
        module = cls(full.in_features, full.out_features, full.bias is not None, group=group,
                     input_is_parallel=input_is_parallel, sequence_parallel=sequence_parallel, chunks=chunks,
                     reduce_dtype=reduce_dtype, num_sms=num_sms, device=full.weight.device, dtype=full.out_dtype)
        module.load_full_fp8_weight(full.weight, full.weight_scale_inv, full.bias)
        module.train(full.training)
        return module

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, dtype: torch.dtype | None = None,
                    group: dist.ProcessGroup | None = None, input_is_parallel: bool = True,
                    sequence_parallel: bool = False, chunks: int = 1, reduce_dtype: torch.dtype = torch.float32,
                    num_sms: int | None = None) -> RowParallelFp8Linear:
        """Quantize a whole nn.Linear per 128x128 block (as Fp8Linear.from_linear, on every rank) and keep this
        rank's shard."""
        return cls.from_fp8_linear(Fp8Linear.from_linear(linear, dtype=dtype), group,
                                   input_is_parallel=input_is_parallel, sequence_parallel=sequence_parallel,
                                   chunks=chunks, reduce_dtype=reduce_dtype, num_sms=num_sms)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        name = type(self).__name__
        expected = self.in_features if self.input_is_parallel else self.full_in_features
        if x.shape[-1] != expected:
            what = "this rank's share of the" if self.input_is_parallel else "all"
            raise ValueError(f"{name}: input has {x.shape[-1]} features in its last dimension, expected {expected} "
                             f"({what} in_features; input_is_parallel={self.input_is_parallel})")
        if not self.input_is_parallel:
            start, stop = self.shard
            x = x[..., start:stop]
        rows = x.reshape(-1, self.in_features)
        if self.sequence_parallel:
            if x.dim() < 2 or x.shape[0] % self.tp_size:
                raise ValueError(f"{name}: a sequence-parallel output is split along the input's first dimension, "
                                 f"which must divide by tp_size={self.tp_size}; got shape {tuple(x.shape)}")
            y = self._gemm_and_reduce_scatter(rows)
            shape = (x.shape[0] // self.tp_size, *x.shape[1:-1], self.out_features)
        else:
            y = self._gemm_and_all_reduce(rows)
            shape = (*x.shape[:-1], self.out_features)
        if y.dtype != self.out_dtype:
            if self.route == "bf16" and self.bias is not None:  # the single layer's matmul adds it before rounding
                return y.add_(self.bias).to(self.out_dtype).reshape(shape)
            y = y.to(self.out_dtype)
        return self._add_bias(y).reshape(shape)

    def _gemm_and_all_reduce(self, rows: torch.Tensor) -> torch.Tensor:
        bounds = chunk_bounds(rows.shape[0], self.chunks)
        if len(bounds) <= 1:
            y = self._linear(rows, self.reduce_dtype)
            if self.tp_size > 1:
                all_reduce_async(y, self.group).wait()
            return y
        pieces, works = [], []
        for offset, size in bounds:
            piece = self._linear(rows[offset:offset + size], self.reduce_dtype)
            works.append(all_reduce_async(piece, self.group))  # runs while the next piece's GEMM does
            pieces.append(piece)
        for work in works:
            work.wait()
        return torch.cat(pieces)

    def _gemm_and_reduce_scatter(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [tp*m, k] -> this rank's [m, N] of the sum over the group, chunk by chunk."""
        tp, k = self.tp_size, self.in_features
        m = rows.shape[0] // tp
        if tp == 1:
            return self._linear(rows, self.reduce_dtype)
        out = torch.empty((m, self.out_features), dtype=self.reduce_dtype, device=rows.device)
        by_rank = rows.reshape(tp, m, k)
        pieces, works = [], []
        for offset, size in chunk_bounds(m, self.chunks):
            # Rows [offset, offset + size) of every rank's share: the piece's reduce-scatter fills ours.
            piece = self._linear(by_rank[:, offset:offset + size].reshape(tp * size, k), self.reduce_dtype)
            works.append(reduce_scatter_async(out[offset:offset + size], piece, self.group))
            pieces.append(piece)  # alive until its reduce-scatter is done
        for work in works:
            work.wait()
        return out

    def extra_repr(self) -> str:
        return (f"input_is_parallel={self.input_is_parallel}, sequence_parallel={self.sequence_parallel}, "
                f"reduce_dtype={self.reduce_dtype}, " + super().extra_repr())
