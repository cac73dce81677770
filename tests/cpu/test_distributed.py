"""deepgemm.distributed on CPU: gloo process groups of 2 and 4 spawned ranks, against the single-process Fp8Linear.

One pool of worker processes per TP size serves every test of this file (starting torch in 4 processes costs
seconds; the tests then take a fraction of one each): a test sends a scenario (a function below) with its arguments
to every rank, each rank runs it on its gloo group and sends back numbers, which the test asserts on. Every scenario
is seeded with the test's printed `seed` (the same on all ranks: they build the same full layer and inputs and take
their shares). The small_fp8_route threshold is passed to the workers, which are other processes.
"""

from __future__ import annotations

import queue
import re
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import deepgemm.api.backend as backend
from deepgemm.distributed import (
    ColumnParallelFp8Linear,
    ColumnParallelFp8TrainingLinear,
    RowParallelFp8Linear,
    RowParallelFp8TrainingLinear,
    shard_fp8_checkpoint,
)
from deepgemm.ops import fp8_linear
from deepgemm.nn.linear import Fp8Linear
from deepgemm.ops import quantize_per_token_group
from deepgemm.reference import fp8_gemm_nt_reference
from deepgemm.utils import calc_diff

TOL = 1e-5  # calc_diff bound against the float64 reference and against the single-process layer (the issue's)
# Results made of the same sums, where only the CPU BLAS may block a float32 matmul of another M or N differently
# (chunked vs whole, a column slice vs all columns): mostly bit-equal, else a few elements one or two BF16 ulps apart
# after the output rounding (calc_diff up to 3e-7 seen over 40 seeds, with one-row chunks). A misplaced row or chunk
# gives calc_diff of order 1.
TIGHT = 2e-6
JOB_TIMEOUT = 60.0  # seconds a scenario may take before the pool is declared hung


# ------------------------------------------------------------------------------------------------- the pool

def _worker(rank: int, world_size: int, store: str, inbox: Any, outbox: Any) -> None:
    torch.set_num_threads(1)  # 4 ranks share CI's 2 cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=JOB_TIMEOUT))
    try:
        while True:
            job = inbox.get()
            if job is None:
                break
            scenario, kwargs = job
            saved = backend.FP8_LINEAR_MIN_WEIGHT_ELEMENTS
            try:
                if kwargs.get("min_weight") is not None:
                    backend.FP8_LINEAR_MIN_WEIGHT_ELEMENTS = kwargs["min_weight"]
                torch.manual_seed(kwargs["seed"])
                result: tuple[str, Any] = ("ok", globals()[scenario](rank, world_size, **kwargs))
            except BaseException:
                result = ("error", traceback.format_exc())
            finally:
                backend.FP8_LINEAR_MIN_WEIGHT_ELEMENTS = saved
            outbox.put((rank, result))
    finally:
        dist.destroy_process_group()


class Pool:
    """`world_size` spawned ranks on one gloo group, running scenarios on request."""

    def __init__(self, world_size: int, folder: Path) -> None:
        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.inboxes = [ctx.Queue() for _ in range(world_size)]
        self.outbox = ctx.Queue()
        self.processes = [ctx.Process(target=_worker, args=(r, world_size, str(folder / "store"), self.inboxes[r],
                                                            self.outbox), daemon=True) for r in range(world_size)]
        for process in self.processes:
            process.start()
        self.broken = False

    def run(self, scenario: str, **kwargs: Any) -> list[Any]:
        """Each rank's return value of `scenario(rank, world_size, **kwargs)`."""
        if self.broken:
            pytest.fail("the worker pool hung in an earlier test")
        for inbox in self.inboxes:
            inbox.put((scenario, kwargs))
        results: dict[int, tuple[str, Any]] = {}
        try:
            while len(results) < self.world_size:
                rank, result = self.outbox.get(timeout=JOB_TIMEOUT)
                results[rank] = result
        except queue.Empty:
            self.broken = True
            self.close()
            pytest.fail(f"{scenario}: ranks {sorted(set(range(self.world_size)) - set(results))} did not answer "
                        f"within {JOB_TIMEOUT} s")
        errors = [f"rank {r}:\n{value}" for r, (status, value) in sorted(results.items()) if status == "error"]
        if errors:
            pytest.fail(f"{scenario} failed:\n" + "\n".join(errors))
        return [results[r][1] for r in range(self.world_size)]

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()  # only the processes this pool started
                process.join(timeout=5)


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"tp{n}")
def pool(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    workers = Pool(request.param, tmp_path_factory.mktemp(f"gloo-tp{request.param}"))
    yield workers
    workers.close()


# ------------------------------------------------------------------------------------- helpers (in the workers)

def full_layer(k: int, n: int, bias: bool, dtype: torch.dtype = torch.bfloat16) -> Fp8Linear:
    """A random unsharded layer (the same on every rank: seeded), with rows of different magnitudes."""
    linear = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        linear.weight.mul_(torch.exp(torch.randn(n, 1) * 0.5))
        if bias:
            linear.bias.normal_()
    return Fp8Linear.from_linear(linear, dtype=dtype)


def activations(*shape: int) -> torch.Tensor:
    return (torch.randn(*shape) * torch.exp(torch.randn(*shape[:-1], 1))).to(torch.bfloat16)


def reference(full: Fp8Linear, x: torch.Tensor) -> torch.Tensor:
    """The dequantized float64 reference of the full layer (same 1x128 activation quantization)."""
    rows = x.reshape(-1, full.in_features)
    q, sf = quantize_per_token_group(rows)
    y = fp8_gemm_nt_reference(q, sf, full.weight, full.weight_scale_inv, torch.float64)
    if full.bias is not None:
        y = y + full.bias.double()
    return y.reshape(*x.shape[:-1], full.out_features)


def compare(y: torch.Tensor, full_y: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    assert y.shape == full_y.shape == ref.shape, (tuple(y.shape), tuple(full_y.shape), tuple(ref.shape))
    return {"equal": bool(torch.equal(y, full_y)), "diff_full": calc_diff(y, full_y), "diff_ref": calc_diff(y, ref),
            "shape": tuple(y.shape), "dtype": str(y.dtype)}


def rows_of(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    share = t.shape[0] // world_size
    return t[rank * share:(rank + 1) * share]


def cols_of(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    share = t.shape[-1] // world_size
    return t[..., rank * share:(rank + 1) * share]


# ------------------------------------------------------------------------------------------------- scenarios

def column_vs_full(rank: int, world_size: int, *, seed: int, k: int, m: int, bias: bool, gather_output: bool,
                   dtype: torch.dtype, **_: Any) -> dict[str, Any]:
    n = 256 * world_size  # two blocks per rank
    full = full_layer(k, n, bias, dtype)
    x = activations(m, 3, k)
    layer = ColumnParallelFp8Linear.from_fp8_linear(full, gather_output=gather_output)
    assert layer.weight.shape == (n // world_size, k) and layer.route == full.route
    y = layer(x)
    full_y, ref = full(x), reference(full, x)
    if not gather_output:
        full_y, ref = cols_of(full_y, rank, world_size), cols_of(ref, rank, world_size)
    return {**compare(y, full_y, ref), "route": layer.route}


def row_vs_full(rank: int, world_size: int, *, seed: int, n: int, m: int, bias: bool, input_is_parallel: bool,
                reduce_dtype: torch.dtype, chunks: int, **_: Any) -> dict[str, Any]:
    k = 128 * world_size * 2
    full = full_layer(k, n, bias)
    x = activations(m, k)
    layer = RowParallelFp8Linear.from_fp8_linear(full, input_is_parallel=input_is_parallel, reduce_dtype=reduce_dtype,
                                                 chunks=chunks)
    assert layer.weight.shape == (n, k // world_size) and layer.route == full.route
    y = layer(cols_of(x, rank, world_size) if input_is_parallel else x)
    return {**compare(y, full(x), reference(full, x)), "route": layer.route}


def column_sequence_parallel(rank: int, world_size: int, *, seed: int, s: int, k: int, chunk_counts: list[int],
                             **_: Any) -> dict[str, Any]:
    n = 256 * world_size
    full = full_layer(k, n, True)
    x = activations(world_size * s, 2, k)  # sequence-first [s, b, k]; this rank holds s of the rows
    full_y, ref = cols_of(full(x), rank, world_size), cols_of(reference(full, x), rank, world_size)
    outputs = {}
    for chunks in chunk_counts:
        layer = ColumnParallelFp8Linear.from_fp8_linear(full, sequence_parallel=True, chunks=chunks)
        assert layer.route == "fp8"
        outputs[chunks] = layer(rows_of(x, rank, world_size))
    base = outputs[1]
    return {"vs_full": compare(base, full_y, ref),
            "chunked": {c: {"equal_base": bool(torch.equal(y, base)), "diff_base": calc_diff(y, base),
                            **compare(y, full_y, ref)} for c, y in outputs.items()}}


def row_sequence_parallel(rank: int, world_size: int, *, seed: int, s: int, n: int, chunk_counts: list[int],
                          reduce_dtype: torch.dtype, **_: Any) -> dict[str, Any]:
    k = 256 * world_size
    full = full_layer(k, n, True)
    x = activations(world_size * s, 3, k)
    full_y, ref = rows_of(full(x), rank, world_size), rows_of(reference(full, x), rank, world_size)
    outputs = {}
    for chunks in chunk_counts:
        layer = RowParallelFp8Linear.from_fp8_linear(full, sequence_parallel=True, chunks=chunks,
                                                     reduce_dtype=reduce_dtype)
        assert layer.route == "fp8"
        outputs[chunks] = layer(cols_of(x, rank, world_size))
    base = outputs[1]
    return {c: {"equal_base": bool(torch.equal(y, base)), "diff_base": calc_diff(y, base),
                **compare(y, full_y, ref)}
            for c, y in outputs.items()}


def sequence_parallel_mlp(rank: int, world_size: int, *, seed: int, s: int, chunks: int, **_: Any) -> dict[str, Any]:
    """up (column, sequence-parallel) -> down (row, sequence-parallel): the activations stay sharded by rows."""
    h, inner = 256, 256 * world_size
    up, down = full_layer(h, inner, True), full_layer(inner, h, True)
    x = activations(world_size * s, h)
    full_y = down(up(x))
    up_tp = ColumnParallelFp8Linear.from_fp8_linear(up, sequence_parallel=True, chunks=chunks)
    down_tp = RowParallelFp8Linear.from_fp8_linear(down, sequence_parallel=True, chunks=chunks)
    y = down_tp(up_tp(rows_of(x, rank, world_size)))
    return {"diff_full": calc_diff(y, rows_of(full_y, rank, world_size)), "shape": tuple(y.shape)}


def training_mlp_vs_full(rank: int, world_size: int, *, seed: int, m: int, bias: bool, input_is_parallel: bool,
                         **_: Any) -> dict[str, Any]:
    """up (column-parallel) -> GELU -> down (row-parallel), trained in FP8, against the same MLP on one process
    (deepgemm.fp8_linear on the whole layers): the output and every gradient, this rank's slices of them."""
    h, inner = 256, 256 * world_size
    up, down = nn.Linear(h, inner, bias=bias), nn.Linear(inner, h, bias=bias)  # FP32 master weights, seeded
    x = activations(m, h)
    dy = activations(m, h)

    def mlp(inp: torch.Tensor, first: nn.Module, second: nn.Module) -> torch.Tensor:
        return second(torch.nn.functional.gelu(first(inp)))

    x_full = x.clone().requires_grad_()
    y_full = fp8_linear(torch.nn.functional.gelu(fp8_linear(x_full, up.weight, up.bias)), down.weight, down.bias)
    y_full.backward(dy)
    up_tp = ColumnParallelFp8TrainingLinear.from_linear(up, gather_output=not input_is_parallel)
    down_tp = RowParallelFp8TrainingLinear.from_linear(down, input_is_parallel=input_is_parallel)
    assert up_tp.weight.shape == (inner // world_size, h) and down_tp.weight.shape == (h, inner // world_size)
    x_tp = x.clone().requires_grad_()
    y = mlp(x_tp, up_tp, down_tp)
    y.backward(dy)
    result = {"y": calc_diff(y.detach(), y_full.detach()), "dx": calc_diff(x_tp.grad, x_full.grad),
              "up_dw": bool(torch.equal(up_tp.weight.grad, rows_of(up.weight.grad, rank, world_size))),
              "down_dw": bool(torch.equal(down_tp.weight.grad, cols_of(down.weight.grad, rank, world_size))),
              "dtypes": (str(y.dtype), str(x_tp.grad.dtype), str(up_tp.weight.grad.dtype)),
              "gemms": (tuple(up_tp.fp8_training_gemm()), tuple(down_tp.fp8_training_gemm()))}
    if bias:
        result["up_db"] = bool(torch.equal(up_tp.bias.grad, rows_of(up.bias.grad, rank, world_size)))
        result["down_db"] = bool(torch.equal(down_tp.bias.grad, down.bias.grad))
    # A layer built in place starts from the whole nn.Linear's initialization, sliced (the same seed on every rank).
    torch.manual_seed(seed + 1)
    built = ColumnParallelFp8TrainingLinear(h, inner, bias=bias), RowParallelFp8TrainingLinear(inner, h, bias=bias)
    torch.manual_seed(seed + 1)
    wholes = nn.Linear(h, inner, bias=bias), nn.Linear(inner, h, bias=bias)
    result["init"] = (bool(torch.equal(built[0].weight, rows_of(wholes[0].weight, rank, world_size)))
                      and bool(torch.equal(built[1].weight, cols_of(wholes[1].weight, rank, world_size))))
    try:
        ColumnParallelFp8TrainingLinear(256, 128 * world_size + 64)
        result["split_block"] = "no error"
    except ValueError as error:
        result["split_block"] = str(error)
    return result


def construction_errors(rank: int, world_size: int, **_: Any) -> dict[str, str]:
    messages = {}
    cases = {
        "column_split_block": lambda: ColumnParallelFp8Linear(256, 128 * world_size + 64),
        "column_not_divisible": lambda: ColumnParallelFp8Linear(256, 128 * world_size + 1),
        "row_split_block": lambda: RowParallelFp8Linear(64 * world_size, 256),
        "sp_and_gather": lambda: ColumnParallelFp8Linear(256, 128 * world_size, sequence_parallel=True,
                                                         gather_output=True),
        "chunks_without_sp": lambda: ColumnParallelFp8Linear(256, 128 * world_size, chunks=2),
        "bad_chunks": lambda: RowParallelFp8Linear(128 * world_size, 256, chunks=0),
    }
    for name, build in cases.items():
        try:
            build()
        except ValueError as error:
            messages[name] = str(error)
        else:
            messages[name] = "no error"
    layer = RowParallelFp8Linear(128 * world_size, 256, sequence_parallel=True)
    try:
        layer(torch.zeros(world_size + 1, 128))
    except ValueError as error:
        messages["sp_rows"] = str(error)
    full = full_layer(256, 128 * world_size, True)
    column = ColumnParallelFp8Linear(256, 128 * world_size)
    try:
        column.load_full_fp8_weight(full.weight[:, :128], full.weight_scale_inv)
    except ValueError as error:
        messages["full_shape"] = str(error)
    return messages


def routed_bf16(rank: int, world_size: int, *, seed: int, **_: Any) -> dict[str, Any]:
    """Without small_fp8_route small layers (full and shards alike) take the dequantized-matmul route: each
    parallel layer against the float64 matmul of its dequantized whole weight, on the same input."""
    k, n, m = 128 * world_size, 128 * world_size, 9
    up, down = full_layer(k, n, True), full_layer(n, k, True)
    x = activations(world_size * m, k)
    column = ColumnParallelFp8Linear.from_fp8_linear(up, sequence_parallel=True, chunks=2)
    row = RowParallelFp8Linear.from_fp8_linear(down, sequence_parallel=True, chunks=3)
    h = column(rows_of(x, rank, world_size))
    y = row(h)
    h_ref = cols_of(x.double() @ _dequantized(up).double().t() + up.bias.double(), rank, world_size)
    # The row layer's input, whole: every rank's column output, gathered here for the reference only.
    h_all = [torch.empty_like(h) for _ in range(world_size)]
    dist.all_gather(h_all, h.contiguous())
    h_full = torch.cat(h_all, dim=-1)
    y_ref = rows_of(h_full.double() @ _dequantized(down).double().t() + down.bias.double(), rank, world_size)
    return {"routes": (up.route, column.route, row.route), "diff_column": calc_diff(h, h_ref),
            "diff_row": calc_diff(y, y_ref)}


class Block(nn.Module):
    """A norm, an up projection (column-parallel when sharded), a down projection (row-parallel), an extra FP8
    layer kept whole, and a buffer."""

    def __init__(self, h: int, inner: int, world_size: int | None) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(h)
        if world_size is None:
            self.up, self.down = Fp8Linear(h, inner, True), Fp8Linear(inner, h, False)
        else:
            self.up, self.down = ColumnParallelFp8Linear(h, inner, True), RowParallelFp8Linear(inner, h, False)
        self.head = Fp8Linear(h, 256, False)
        self.register_buffer("scale", torch.ones(4))


def checkpoint_slices(rank: int, world_size: int, *, seed: int, folder: str, high_precision: bool,
                      scale_dtype: torch.dtype, **_: Any) -> dict[str, Any]:
    from safetensors.torch import save_file

    import deepgemm.nn.checkpoint as nn_checkpoint

    h, inner = 256, 256 * world_size
    whole = Block(h, inner, None)
    with torch.no_grad():
        for name, layer in (("up", full_layer(h, inner, True)), ("down", full_layer(inner, h, False)),
                            ("head", full_layer(h, 256, False))):
            getattr(whole, name).load_fp8_weight(layer.weight, layer.weight_scale_inv)
            if layer.bias is not None:
                getattr(whole, name).bias.copy_(layer.bias)
        whole.norm.weight.normal_()
        whole.scale.normal_()
    path = Path(folder) / "ckpt.safetensors"
    if rank == 0:
        tensors = {key: t.contiguous() for key, t in whole.state_dict().items()}
        for name in ("up", "down"):
            if high_precision:  # a BF16 checkpoint weight (no scales): each rank quantizes its slice
                tensors[f"{name}.weight"] = _dequantized(getattr(whole, name)).to(torch.bfloat16)
                del tensors[f"{name}.weight_scale_inv"]
            else:
                tensors[f"{name}.weight_scale_inv"] = tensors[f"{name}.weight_scale_inv"].to(scale_dtype)
        save_file(tensors, str(path))
    dist.barrier()

    read_whole: list[str] = []
    original = nn_checkpoint._Checkpoint.read

    def spy(self: Any, name: str) -> torch.Tensor:
        read_whole.append(name)
        return original(self, name)

    nn_checkpoint._Checkpoint.read = spy  # type: ignore[method-assign]
    try:
        sharded = Block(h, inner, world_size)
        report = shard_fp8_checkpoint(sharded, path)
    finally:
        nn_checkpoint._Checkpoint.read = original  # type: ignore[method-assign]

    if high_precision:
        expected_up = ColumnParallelFp8Linear.from_fp8_linear(
            Fp8Linear.from_linear(_as_linear(_dequantized(whole.up).to(torch.bfloat16), whole.up.bias)))
        expected_down = RowParallelFp8Linear.from_fp8_linear(
            Fp8Linear.from_linear(_as_linear(_dequantized(whole.down).to(torch.bfloat16), None)))
    else:  # the checkpoint's scales (rounded to scale_dtype when stored so), converted to float32
        expected_up, expected_down = ColumnParallelFp8Linear(h, inner, True), RowParallelFp8Linear(inner, h, False)
        expected_up.load_full_fp8_weight(whole.up.weight, whole.up.weight_scale_inv.to(scale_dtype).float(),
                                         whole.up.bias)
        expected_down.load_full_fp8_weight(whole.down.weight, whole.down.weight_scale_inv.to(scale_dtype).float())
    same = {name: all(torch.equal(a.float(), b.float()) for a, b in zip(
                [getattr(sharded, name).weight, getattr(sharded, name).weight_scale_inv],
                [expected.weight, expected.weight_scale_inv]))
            for name, expected in (("up", expected_up), ("down", expected_down))}
    same["up.bias"] = bool(torch.equal(sharded.up.bias, expected_up.bias))
    same["rest"] = all(torch.equal(a, b) for a, b in ((sharded.norm.weight, whole.norm.weight),
                                                       (sharded.scale, whole.scale),
                                                       (sharded.head.weight, whole.head.weight)))
    n_l = k_l = inner // world_size
    weight_bytes = (n_l * h + h * k_l) * (2 if high_precision else 1)  # e4m3 (or bf16) slices
    scale_bytes = 0 if high_precision else (n_l // 128 * h // 128 + h // 128 * k_l // 128) * scale_dtype.itemsize
    bias_bytes = n_l * whole.up.bias.element_size()  # the column-parallel bias slice
    rest_bytes = sum(t.numel() * t.element_size() for t in (whole.norm.weight, whole.scale, whole.head.weight,
                                                             whole.head.weight_scale_inv))
    return {"same": same, "bytes_read": report.bytes_read,
            "expected_bytes": weight_bytes + scale_bytes + bias_bytes + rest_bytes,
            "read_whole": sorted(read_whole), "fp8_layers": sorted(report.fp8_layers),
            "shapes": (tuple(sharded.up.weight.shape), tuple(sharded.down.weight.shape))}


def _dequantized(layer: Fp8Linear) -> torch.Tensor:
    from deepgemm.api.quant import dequantize_per_block
    return dequantize_per_block(layer.weight, layer.weight_scale_inv, 128, torch.float32)


def _as_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


def checkpoint_errors(rank: int, world_size: int, *, seed: int, folder: str, **_: Any) -> dict[str, str]:
    from safetensors.torch import save_file

    h, inner = 256, 256 * world_size
    path = Path(folder) / "wrong.safetensors"
    if rank == 0:
        wrong = full_layer(h, inner + 128 * world_size, True)  # the whole layer has another N
        save_file({"weight": wrong.weight, "weight_scale_inv": wrong.weight_scale_inv, "bias": wrong.bias},
                  str(path))
    dist.barrier()
    messages = {}
    for name, module in (("shape", ColumnParallelFp8Linear(h, inner, True)),
                         ("missing", nn.ModuleDict({"up": ColumnParallelFp8Linear(h, inner + 128 * world_size)}))):
        try:
            shard_fp8_checkpoint(module, path)
        except ValueError as error:
            messages[name] = str(error)
    report = shard_fp8_checkpoint(nn.ModuleDict({"up": ColumnParallelFp8Linear(h, inner + 128 * world_size)}), path,
                                  strict=False)
    messages["not_strict"] = f"{report.missing} {report.unexpected}"
    # A tied pair (an embedding and a head sharing one weight) stored under one name: nothing is missing.
    tied = nn.ModuleDict({"embed": nn.Embedding(16, 32), "head": nn.Linear(32, 16, bias=False)})
    tied.head.weight = tied.embed.weight
    tied_path = Path(folder) / "tied.safetensors"
    if rank == 0:
        save_file({"embed.weight": torch.arange(512.0).view(16, 32)}, str(tied_path))
    dist.barrier()
    tied_report = shard_fp8_checkpoint(tied, tied_path)
    messages["tied"] = f"{tied_report.missing} {float(tied.head.weight[1, 0])}"
    # The same pair stored under both names with different values: refused (one of them was dropped silently).
    twice_path = Path(folder) / "tied_twice.safetensors"
    if rank == 0:
        save_file({"embed.weight": torch.arange(512.0).view(16, 32), "head.weight": torch.zeros(16, 32)},
                  str(twice_path))
    dist.barrier()
    try:
        shard_fp8_checkpoint(tied, twice_path)
    except ValueError as error:
        messages["tied_twice"] = f"{error} {float(tied.head.weight[1, 0])}"
    try:  # an FP8 format the model's tensor does not have is refused, not converted
        holder = nn.Module()
        holder.register_buffer("experts", torch.zeros(4, 128, dtype=torch.float8_e4m3fn))
        e5m2_path = Path(folder) / "e5m2.safetensors"
        if rank == 0:
            save_file({"experts": torch.ones(4, 128).to(torch.float8_e5m2)}, str(e5m2_path))
        dist.barrier()
        shard_fp8_checkpoint(holder, e5m2_path)
        messages["e5m2"] = "loaded"
    except ValueError as error:
        messages["e5m2"] = str(error)
    return messages


# ------------------------------------------------------------------------------------------------- tests

def small(threshold: int) -> dict[str, Any]:
    return {"min_weight": threshold}


@pytest.mark.parametrize("gather_output", [False, True])
def test_column_parallel_equals_the_full_layer(pool: Pool, seed: int, small_fp8_route: int,
                                               gather_output: bool) -> None:
    # K = 320: a partial last scale block along K, which column-parallel keeps whole on every rank.
    for dtype, bias in ((torch.bfloat16, True), (torch.float32, False)):
        for result in pool.run("column_vs_full", seed=seed, k=320, m=7, bias=bias, gather_output=gather_output,
                               dtype=dtype, **small(small_fp8_route)):
            assert result["route"] == "fp8"
            assert result["diff_ref"] < TOL and result["diff_full"] < TOL, result
            # The same GEMM on a subset of the columns: the same sums.
            assert result["diff_full"] < TIGHT, result


@pytest.mark.parametrize("reduce_dtype", [torch.float32, torch.bfloat16], ids=["fp32-sum", "bf16-sum"])
def test_row_parallel_equals_the_full_layer(pool: Pool, seed: int, small_fp8_route: int,
                                            reduce_dtype: torch.dtype) -> None:
    # N = 264: a partial last block of output rows. Partial sums over K are added in another order than the
    # single layer's GEMM: equal within a tolerance, not bit-equal.
    for input_is_parallel, chunks, bias in ((True, 1, True), (False, 1, False), (True, 3, True)):
        for result in pool.run("row_vs_full", seed=seed, n=264, m=11, bias=bias, input_is_parallel=input_is_parallel,
                               reduce_dtype=reduce_dtype, chunks=chunks, **small(small_fp8_route)):
            assert result["route"] == "fp8" and result["shape"] == (11, 264)
            bound = TOL if reduce_dtype == torch.float32 else 2 * TOL  # BF16 partials: see the next test
            assert result["diff_ref"] < bound and result["diff_full"] < bound, result
            if reduce_dtype == torch.float32:  # one rounding after the sum, as the single layer: nearly its bits
                assert result["diff_full"] < 1e-6, result


def test_routed_row_parallel_float32_sum_rounds_once(pool: Pool, seed: int) -> None:
    """On the dequantized-matmul route (small shards, no small_fp8_route) a float32 reduction sums float32 partials
    and adds the bias before its one rounding, as the single layer's matmul does (the partials were computed in BF16
    and rounded before the sum: calc_diff ~4e-6 against the single layer)."""
    for result in pool.run("row_vs_full", seed=seed, n=264, m=11, bias=True, input_is_parallel=True,
                           reduce_dtype=torch.float32, chunks=1):
        assert result["route"] == "bf16" and result["diff_full"] < 1e-6, result


def test_column_sequence_parallel_chunks(pool: Pool, seed: int, small_fp8_route: int) -> None:
    # 5 local rows x 2 = 10 rows per rank: counts that divide it, that do not, and more chunks than rows.
    results = pool.run("column_sequence_parallel", seed=seed, s=5, k=256, chunk_counts=[1, 2, 3, 4, 7, 16],
                       **small(small_fp8_route))
    for result in results:
        # quantize each rank's rows, gather, one GEMM: the full layer's rows, the same sums
        assert result["vs_full"]["diff_full"] < TIGHT, result
        for chunks, check in result["chunked"].items():
            assert check["shape"][0] == 5 * len(results), check
            assert check["diff_ref"] < TOL, (chunks, check)
            assert check["diff_base"] < TIGHT, (chunks, check)


@pytest.mark.parametrize("reduce_dtype", [torch.float32, torch.bfloat16], ids=["fp32-sum", "bf16-sum"])
def test_row_sequence_parallel_chunks(pool: Pool, seed: int, small_fp8_route: int,
                                      reduce_dtype: torch.dtype) -> None:
    for result in pool.run("row_sequence_parallel", seed=seed, s=3, n=264, chunk_counts=[1, 2, 4, 5, 9, 20],
                           reduce_dtype=reduce_dtype, **small(small_fp8_route)):
        for chunks, check in result.items():
            assert check["shape"] == (3, 3, 264), check
            # BF16 partial sums round once per rank: at TP 2 and 4 still within the target (TP 8 is not, see
            # RowParallelFp8Linear), with a margin here for the seed.
            bound = TOL if reduce_dtype == torch.float32 else 2 * TOL
            assert check["diff_ref"] < bound and check["diff_full"] < bound, (chunks, check)
            # The same partial sums, in pieces; a sum that cancels can move by more than one ulp of itself when a
            # partial moves by float32 noise, so only calc_diff here.
            assert check["diff_base"] < TIGHT, (chunks, check)


def test_sequence_parallel_mlp(pool: Pool, seed: int, small_fp8_route: int) -> None:
    for chunks in (1, 3):
        for result in pool.run("sequence_parallel_mlp", seed=seed, s=6, chunks=chunks, **small(small_fp8_route)):
            assert result["shape"] == (6, 256) and result["diff_full"] < TOL, result


def test_routed_layers(pool: Pool, seed: int) -> None:
    for result in pool.run("routed_bf16", seed=seed):
        assert result["routes"] == ("bf16", "bf16", "bf16")
        assert result["diff_column"] < TOL and result["diff_row"] < TOL, result


@pytest.mark.parametrize("input_is_parallel", [True, False])
def test_training_mlp_equals_the_full_mlp(pool: Pool, seed: int, input_is_parallel: bool) -> None:
    """Every GEMM of the TP step is the single process's GEMM on a slice (the 128-aligned shards keep the scale
    groups), so the forward and the slices of dW match it to float32 noise; dx and the row layer's output sum
    partials in another order (float32, one rounding)."""
    for bias in (True, False):
        for result in pool.run("training_mlp_vs_full", seed=seed, m=37, bias=bias,
                               input_is_parallel=input_is_parallel):
            tp = pool.world_size
            assert result["dtypes"] == ("torch.bfloat16", "torch.bfloat16", "torch.float32"), result
            assert result["y"] < TOL and result["dx"] < TOL, result
            # the same GEMMs on slices of the same operands: this rank's dW and db bit for bit
            assert result["up_dw"] and result["down_dw"] and result.get("up_db", True) and result.get("down_db", True)
            assert result["gemms"] == ((256, 256, torch.float32, None), (256, 256, torch.float32, torch.float32)), result
            assert result["init"], result
            assert f"must be a multiple of 128 * {tp}" in result["split_block"], result


def test_training_layers_need_a_process_group() -> None:
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        ColumnParallelFp8TrainingLinear(256, 256)


def test_construction_errors(pool: Pool, seed: int) -> None:
    tp = pool.world_size
    for messages in pool.run("construction_errors", seed=seed):
        for case in ("column_split_block", "column_not_divisible"):
            text = messages[case]
            assert f"out_features={128 * tp + (64 if case == 'column_split_block' else 1)}" in text, text
            assert f"group of {tp} ranks" in text and f"multiple of 128 * {tp} = {128 * tp}" in text, text
            assert "ColumnParallelFp8Linear" in text and "scale block" in text, text
        assert f"in_features={64 * tp}" in messages["row_split_block"]
        assert f"multiple of 128 * {tp}" in messages["row_split_block"]
        assert "exclude each other" in messages["sp_and_gather"]
        assert "needs sequence_parallel=True" in messages["chunks_without_sp"]
        assert "'chunks' must be a positive int" in messages["bad_chunks"]
        assert f"divide by tp_size={tp}" in messages["sp_rows"]
        assert "full layer's float8_e4m3fn" in messages["full_shape"]


@pytest.mark.parametrize("reduce_dtype", [torch.float16, None, "float32"])
def test_reduce_dtype_rule_names_only_what_it_takes(reduce_dtype: object) -> None:
    """Checked before any process group is needed; the message listed "or None", which it refuses."""
    with pytest.raises(TypeError, match="'reduce_dtype' must be torch.float32 or torch.bfloat16, got") as error:
        RowParallelFp8Linear(256, 256, reduce_dtype=reduce_dtype)  # type: ignore[arg-type]
    assert "None," not in str(error.value) and "or None" not in str(error.value)


@pytest.mark.parametrize("high_precision, scale_dtype", [(False, torch.float32), (False, torch.bfloat16),
                                                         (True, torch.float32)], ids=["fp8", "bf16-scales", "bf16"])
def test_checkpoint_reads_only_the_slices(pool: Pool, seed: int, small_fp8_route: int, tmp_path: Path,
                                          high_precision: bool, scale_dtype: torch.dtype) -> None:
    pytest.importorskip("safetensors")
    tp = pool.world_size
    for result in pool.run("checkpoint_slices", seed=seed, folder=str(tmp_path), high_precision=high_precision,
                           scale_dtype=scale_dtype, **small(small_fp8_route)):
        assert result["same"] == {"up": True, "down": True, "up.bias": True, "rest": True}, result
        assert result["shapes"] == ((256, 256), (256, 256)), result  # [inner/tp, h] and [h, inner/tp]
        # The parallel layers' tensors come through get_slice only; the rest is read whole.
        assert result["read_whole"] == ["head.weight", "head.weight_scale_inv", "norm.weight", "scale"], result
        assert result["bytes_read"] == result["expected_bytes"], result
        assert result["fp8_layers"] == ["down", "up"]
    del tp


def test_checkpoint_errors(pool: Pool, seed: int, small_fp8_route: int, tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    tp = pool.world_size
    for messages in pool.run("checkpoint_errors", seed=seed, folder=str(tmp_path), **small(small_fp8_route)):
        assert f"'weight' has shape [{384 * tp}, 256] in the checkpoint, the whole layer ColumnParallelFp8Linear " \
               f"expects [{256 * tp}, 256]" in messages["shape"], messages
        assert "missing" in messages["missing"] and "up.weight" in messages["missing"], messages
        assert "up.weight" in messages["not_strict"]
        assert messages["tied"] == "[] 32.0", messages  # was: lm_head-style 'head.weight' reported missing
        assert "'embed.weight' and 'head.weight' name one tied tensor" in messages.get("tied_twice", ""), messages
        assert messages["tied_twice"].endswith(" 32.0"), messages  # checked before anything was loaded
        assert "'experts' is float8_e5m2 in the checkpoint" in messages["e5m2"], messages


def test_the_library_sets_no_environment_variables() -> None:
    """Launchers and tests set NCCL's variables (docs/distributed.md); the library only reads its own."""
    package = Path(__file__).resolve().parents[2] / "deepgemm" / "distributed"
    for path in package.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"os\.environ|putenv|setenv|unsetenv", text), path
