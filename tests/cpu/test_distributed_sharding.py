"""deepgemm.distributed without a process group: the sharding rule, the chunk split, the errors before any
communication (the layers on real gloo groups are tests/cpu/test_distributed.py)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from deepgemm.distributed import ColumnParallelFp8Linear, RowParallelFp8Linear, chunk_bounds, shard_bounds


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_shards_tile_the_dimension_on_block_boundaries(tp: int) -> None:
    size = 128 * tp * 3
    bounds = [shard_bounds(size, tp, r, layer="L", dim="out_features") for r in range(tp)]
    assert bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert all(start % 128 == 0 and stop - start == size // tp for start, stop in bounds)


def test_one_rank_holds_any_size() -> None:
    assert shard_bounds(200, 1, 0, layer="L", dim="in_features") == (0, 200)


@pytest.mark.parametrize("size, tp, share", [(384, 2, "192"), (7168 + 64, 8, "904"), (1000, 3, "1000/3 = 333.333")])
def test_a_shard_that_splits_a_scale_block_is_refused(size: int, tp: int, share: str) -> None:
    with pytest.raises(ValueError) as error:
        shard_bounds(size, tp, 0, layer="ColumnParallelFp8Linear(in_features=7168, out_features=384)",
                     dim="out_features")
    text = str(error.value)
    assert "ColumnParallelFp8Linear(in_features=7168" in text  # the layer and its size
    assert f"out_features={size}" in text and f"group of {tp} ranks" in text  # the size, the TP size
    assert f"multiple of 128 * {tp} = {128 * tp}" in text and f"({share})" in text  # the rule
    assert "split a 128x128 block of weight_scale_inv" in text


def test_the_error_suggests_the_nearest_valid_sizes() -> None:
    with pytest.raises(ValueError, match=r"nearest: 256 or 512"):
        shard_bounds(384, 2, 0, layer="L", dim="out_features")
    with pytest.raises(ValueError, match=r"nearest: 1024\)"):
        shard_bounds(640, 8, 0, layer="L", dim="in_features")


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_sizes_and_ranks_are_checked(bad: object) -> None:
    with pytest.raises(ValueError):
        shard_bounds(bad, 2, 0, layer="L", dim="d")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        shard_bounds(256, bad, 0, layer="L", dim="d")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'rank' must be an int in"):
        shard_bounds(256, 2, 2, layer="L", dim="d")


@pytest.mark.parametrize("rows, chunks", [(10, 1), (10, 3), (10, 4), (10, 10), (10, 16), (1, 5), (4096, 7)])
def test_chunks_cover_the_rows_in_order(rows: int, chunks: int) -> None:
    bounds = chunk_bounds(rows, chunks)
    assert len(bounds) == min(rows, chunks)
    assert [offset for offset, _ in bounds] == [sum(size for _, size in bounds[:i]) for i in range(len(bounds))]
    assert sum(size for _, size in bounds) == rows
    sizes = {size for _, size in bounds}
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_no_rows_no_chunks() -> None:
    assert chunk_bounds(0, 4) == []


def test_layers_need_an_initialized_process_group() -> None:
    assert not dist.is_initialized()
    for build in (lambda: ColumnParallelFp8Linear(256, 256), lambda: RowParallelFp8Linear(256, 256)):
        with pytest.raises(RuntimeError, match="init_process_group"):
            build()
