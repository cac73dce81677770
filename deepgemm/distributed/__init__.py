"""Tensor parallelism on torch.distributed (NCCL on GPUs, gloo on CPUs): column- and row-parallel FP8 linear
layers for inference and for FP8 training, the inference layers' sequence-parallel variants (chunked all-gather /
reduce-scatter pipelined with the GEMM), and an FP8 checkpoint loader that reads each rank's slice. Import it explicitly (`import deepgemm.distributed`); it sets no
environment variable: launchers set NCCL's (docs/distributed.md)."""

from deepgemm.distributed.checkpoint import shard_fp8_checkpoint
from deepgemm.distributed.comm import chunk_bounds
from deepgemm.distributed.linear import ColumnParallelFp8Linear, RowParallelFp8Linear
from deepgemm.distributed.sharding import shard_bounds
from deepgemm.distributed.training import ColumnParallelFp8TrainingLinear, RowParallelFp8TrainingLinear

__all__ = [
    "ColumnParallelFp8Linear",
    "ColumnParallelFp8TrainingLinear",
    "RowParallelFp8Linear",
    "RowParallelFp8TrainingLinear",
    "chunk_bounds",
    "shard_bounds",
    "shard_fp8_checkpoint",
]
