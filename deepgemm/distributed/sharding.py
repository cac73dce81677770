"""Which slice of a layer each tensor-parallel rank holds, and the rule that keeps 128x128 scale blocks whole."""

from __future__ import annotations

import torch.distributed as dist

from deepgemm.utils import ceil_div

BLOCK = 128  # the weight's scale block (weight_scale_inv holds one scale per 128x128 block)


def shard_bounds(size: int, tp_size: int, rank: int, *, layer: str, dim: str) -> tuple[int, int]:
    """[start, stop) of rank `rank`'s equal share of a dimension of `size` split over `tp_size` ranks.

    The rule: with more than one rank, every share must be a whole number of 128-wide scale blocks, i.e. `size` must
    be a multiple of 128 * tp_size, so that no rank's slice splits a block of `weight_scale_inv` (one rank would
    otherwise need a scale that also belongs to its neighbour). One rank holds everything, whatever the size.

    Args:
        size: the dimension's length (a positive int).
        tp_size: the number of ranks (a positive int).
        rank: this rank, in [0, tp_size).
        layer / dim: the layer's and the dimension's names, for the message.

    Raises:
        ValueError: naming the layer, the size, the TP size and the rule: a size or tp_size that is not a positive
            int, a rank out of range, or a size that is not a multiple of 128 * tp_size.

    Example::

        from deepgemm.distributed import shard_bounds

        shard_bounds(18432, 8, 3, layer="up_proj", dim="out_features")   # (6912, 9216)
    """
    for name, value in (("size", size), ("tp_size", tp_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{layer}: '{name}' must be a positive int, got {value!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < tp_size:
        raise ValueError(f"{layer}: 'rank' must be an int in [0, {tp_size}), got {rank!r}")
    if tp_size == 1:
        return 0, size
    unit = BLOCK * tp_size
    if size % unit != 0:
        each = f"{size // tp_size}" if size % tp_size == 0 else f"{size}/{tp_size} = {size / tp_size:g}"
        lower, upper = size // unit * unit, ceil_div(size, unit) * unit
        near = f"{upper}" if lower == 0 else f"{lower} or {upper}"
        raise ValueError(
            f"{layer}: cannot shard {dim}={size} over a tensor-parallel group of {tp_size} ranks: each rank's share "
            f"({each}) must be a whole number of {BLOCK}-wide scale blocks, so {dim} must be a multiple of "
            f"{BLOCK} * {tp_size} = {unit} (nearest: {near}); otherwise a rank's slice would split a {BLOCK}x{BLOCK} "
            f"block of weight_scale_inv")
    share = size // tp_size
    return rank * share, (rank + 1) * share


def scale_bounds(start: int, stop: int) -> tuple[int, int]:
    """The weight_scale_inv rows (or columns) that cover weight rows (or columns) [start, stop); `start` is on a
    block boundary (shard_bounds makes it so), `stop` may end inside the last, partial block."""
    assert start % BLOCK == 0, "shard_bounds keeps shards on 128 boundaries"
    return start // BLOCK, ceil_div(stop, BLOCK)


def group_size_rank(group: dist.ProcessGroup | None, layer: str) -> tuple[dist.ProcessGroup, int, int]:
    """(the group, its size, this process's rank in it); `None` is the default (world) group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{layer}: torch.distributed is not initialized: call torch.distributed."
                           f"init_process_group(...) (NCCL on GPUs, gloo on CPUs) before building a parallel layer")
    resolved = dist.group.WORLD if group is None else group
    if not isinstance(resolved, dist.ProcessGroup):
        raise TypeError(f"{layer}: 'group' must be a torch.distributed ProcessGroup or None (the world), "
                        f"got {type(group).__name__}")
    rank = dist.get_rank(resolved)
    if rank < 0:
        raise ValueError(f"{layer}: this process (global rank {dist.get_rank()}) is not a member of 'group'")
    return resolved, dist.get_world_size(resolved), rank


def check_chunks(chunks: object, layer: str) -> int:
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks <= 0:
        raise ValueError(f"{layer}: 'chunks' must be a positive int (1: no overlap), got {chunks!r}")
    return chunks


def check_num_sms(num_sms: object, layer: str) -> int | None:
    if num_sms is None:
        return None
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms <= 0:
        raise ValueError(f"{layer}: 'num_sms' must be a positive int or None (all SMs), got {num_sms!r}")
    return num_sms
