"""Split and stream tails on CPU: sm_90a builds, config labels, the opt-in and the stream tail's schedule."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepgemm.api.gemm import planned_spec
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import model_split_tail
from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import compile_spec, Fp8GemmSpec, render_source


@pytest.mark.parametrize("m,n,k,block_m,block_n,out_dtype,mode", [
    (4096, 2112, 7168, 128, 128, torch.bfloat16, "split"),
    (4096, 2112, 7168, 256, 128, torch.bfloat16, "split"),
    (300, 2112, 7296, 256, 128, torch.float32, "split"),  # chunked store (spilled 4 bytes with NVRTC 13.0 before v22c)
    (1000, 2056, 7296, 128, 104, torch.float32, "split"),
    (129, 7168, 2048, 64, 112, torch.bfloat16, "split"),
    (4096, 4096, 7168, 256, 128, torch.bfloat16, "stream"),
    (4096, 2112, 7168, 128, 192, torch.bfloat16, "stream"),
    (4096, 7168, 7168, 256, 128, torch.float32, "stream"),
    (2000, 1024, 7296, 192, 128, torch.bfloat16, "stream"),
    (129, 7168, 2048, 64, 112, torch.bfloat16, "stream"),
])
def test_tail_kernels_build_without_spills(m: int, n: int, k: int, block_m: int, block_n: int, out_dtype: torch.dtype,
                                           mode: str) -> None:
    config = make_config(m, n, k, block_m, block_n, 132, 4 if out_dtype == torch.float32 else 2, cluster_m=1,
                         split_tail=mode == "split", stream_tail=mode == "stream")
    assert config.label().endswith(" sk1" if mode == "split" else " sk2")
    compiled = compile_spec(Fp8GemmSpec(n, k, out_dtype, config))
    assert compiled.resources is not None
    assert (compiled.resources.spill_stores, compiled.resources.stack_frame) == (0, 0)


def test_split_tail_is_opt_in_except_for_block_m_192() -> None:
    """The model builds plain tiles (block_m 192, on request, as the split-tail kernel); a split tail is a config
    choice (the tuner's, or an experiment's), which the spec renders as the split kernel."""
    plain = planned_spec(4096, 7168, 2048, torch.bfloat16, 132).config
    assert plain.block_m == 256 and not plain.split_tail and not plain.stream_tail
    assert model_split_tail(768, 3072, 7168, 192, 128, 132)  # block_m 192 (on request) builds as the split-tail kernel
    forced = dataclasses.replace(planned_spec(4096, 7168, 16384, torch.bfloat16, 132).config, split_tail=True)
    assert forced.split_tail and not forced.stream_tail
    assert "TailMode::kSplit" in render_source(Fp8GemmSpec(7168, 16384, torch.bfloat16, forced)).code


def test_block_m_192_split_tail_only_with_long_ranges() -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import split_tail_for, split_tail_ranges

    assert split_tail_ranges(544, 132, 56) == 8 and split_tail_ranges(374, 132, 56) == 1
    assert split_tail_ranges(176, 132, 12) == 3 and split_tail_ranges(132, 132, 56) == 1
    assert split_tail_ranges(133, 132, 2) == 2  # at most one range per K block
    assert split_tail_for(192, 374, 132, 56)  # nothing splits: the split-tail build only
    assert split_tail_for(192, 176, 132, 56)  # 3 ranges of >= 18 K blocks
    assert not split_tail_for(192, 176, 132, 12)  # 3 ranges of 4 K blocks: short ranges measured slower
    assert not split_tail_for(256, 374, 132, 56) and not split_tail_for(128, 544, 132, 56)
    # A block_m 192 tile, asked for, is built as the split-tail kernel (96 tiles: one wave, nothing splits).
    assert model_split_tail(768, 3072, 7168, 192, 128, 132)
    assert not model_split_tail(768, 3072, 7168, 128, 160, 132)  # other tiles only where it splits (tuner)


def stream_schedule(tiles: int, grid: int, k_blocks: int, split: int) -> list[list[tuple[int, int, int]]]:
    """StreamTailTileScheduler's tail pieces per CTA, as (tail tile, k_begin, k_end), written out by hand: the
    ends on the CTAs the last wave would leave idle (the lowest), a head on each of the others."""
    tail = tiles % grid
    idle = grid - tail
    pieces: list[list[tuple[int, int, int]]] = [[(t, split, k_blocks) for t in range(j, tail, idle)] for j in range(idle)]
    pieces += [[(t, 0, split)] for t in range(tail)]
    return pieces


@pytest.mark.parametrize("tiles,grid,k_blocks,split", [
    (512, 132, 56, 52),  # 116 tail tiles, 16 idle CTAs: ends of 4 K blocks, 8 per CTA
    (896, 132, 128, 104),  # 104 tail tiles, 28 idle CTAs: 4 ends of 24 each
    (352, 132, 56, 39),  # 88 tail tiles, 44 idle: 2 ends of 17 each
    (32, 12, 56, 39), (34, 20, 57, 45), (17, 24, 56, 44), (192, 120, 16, 12), (40, 66, 32, 23),
    (192, 100, 16, None),  # 12 ends per idle CTA: a head would need all 16 K blocks
    (199, 100, 3, None),
])
def test_stream_tail_schedule_balances_heads_against_ends(tiles: int, grid: int, k_blocks: int, split: int | None) -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import STREAM_TAIL_WRITE_BLOCKS, stream_tail_pieces, stream_tail_split

    assert stream_tail_split(tiles, grid, k_blocks) == split
    if split is None:
        assert stream_tail_pieces(tiles, grid, k_blocks) == 1
        return
    assert stream_tail_pieces(tiles, grid, k_blocks) == 2
    tail = tiles % grid
    pieces = stream_schedule(tiles, grid, k_blocks, split)  # (the device scheduler's coverage: tile_schedulers_host.cpp)
    head = split
    ends = max(len(mine) * (k_blocks - split + STREAM_TAIL_WRITE_BLOCKS) for mine in pieces[:grid - tail])
    assert ends <= head + STREAM_TAIL_WRITE_BLOCKS  # the idle CTAs' ends finish about when the heads do
    # The last wave shrinks from a whole tile to the longer of a head and an idle CTA's ends.
    assert max(head, ends - STREAM_TAIL_WRITE_BLOCKS) < k_blocks


def test_stream_tail_is_the_tuners_choice_not_the_models(tmp_path) -> None:  # noqa: ANN001
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import choose_fp8_gemm_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import stream_tail_applies, stream_tail_pieces
    from deepgemm.tuning.tuner import candidate_configs
    from deepgemm.tuning.db import TuningDB

    assert stream_tail_pieces(3072, 132, 12) == 1  # a tail of 36 tiles: at most half the grid
    assert stream_tail_pieces(528, 132, 56) == 1  # whole waves
    assert stream_tail_applies(4096, 4096, 7168, 256, 128, 132)  # 512 tiles: a tail of 116
    assert stream_tail_applies(4096, 2112, 7168, 128, 192, 132)  # 352 tiles: a tail of 88
    assert not stream_tail_applies(4096, 4224, 7168, 256, 128, 132)  # 528 tiles: whole waves
    assert not stream_tail_applies(64, 4096, 7168, 64, 32, 132)  # fewer tiles than SMs
    assert not choose_fp8_gemm_config(4096, 4096, 7168, 132).stream_tail  # measured slower for block_m 256
    candidates = candidate_configs(4096, 2112, 7168, 132, 2, top=6)
    streams = [c for c in candidates if c.stream_tail]
    assert streams and all(c.cluster_m == 1 and not c.split_tail and c.label().endswith(" sk2") for c in streams)
    # A tuned stream tail round-trips, and stands only at Ms of its bucket where the tail splits.
    path = tmp_path / "t.json"
    TuningDB(path).record(4096, 2112, 7168, 132, streams[0], 100.0)
    assert TuningDB(path).lookup(4096, 2112, 7168, 132).stream_tail
    tiles_at_3968 = -(-3968 // streams[0].block_m) * -(-2112 // streams[0].block_n)
    assert TuningDB(path).lookup(3968, 2112, 7168, 132).stream_tail == (tiles_at_3968 % 132 * 2 > 132)
    with pytest.raises(ValueError, match="choose one"):
        make_config(4096, 4096, 7168, 256, 128, 132, split_tail=True, stream_tail=True)
