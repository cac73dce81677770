"""The BF16 split-K rules on the host (no GPU): where the cost model builds a split-K kernel (dense decode sizes where
its plain pick is narrow or leaves most SMs idle, enough K per range, never grouped or M > 128), the host mirror of the scheduler's range count, the split build's
shared memory, the spec's refusal for grouped kinds, and tuned split-K entries."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from deepgemm.kernels.common.kind import GemmKind
from deepgemm.kernels.common.split_scratch import split_tail_ranges
from deepgemm.kernels.sm90_bf16_gemm import cost_model
from deepgemm.kernels.sm90_bf16_gemm.config import SPLIT_FLAG_BYTES, bf16_smem_bytes
from deepgemm.kernels.sm90_bf16_gemm.cost_model import (DECODE_MAX_M, DECODE_SPLIT_BLOCK_N, DECODE_SPLIT_MAX_BLOCK_N,
                                                         DECODE_SPLIT_MIN_RANGES, DECODE_SPLIT_TUNER_BLOCK_N,
                                                         SPLIT_MIN_K_BLOCKS, Bf16Problem,
                                                         choose_config, make_config, ranked_configs, split_k_ranges)
from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16Geometry, grouped_spec
from deepgemm.tuning.db import TuningDB
from deepgemm.utils import ceil_div


def nt(m: int, n: int, k: int, sms: int = 132, groups: int = 1) -> Bf16Problem:
    return Bf16Problem(m, n, k, False, False, 2, 0, sms, groups)


@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (64, 2112, 7168), (128, 2112, 7168), (16, 1536, 7168)])
def test_narrow_decode_picks_become_64_wide_split_k(m: int, n: int, k: int) -> None:
    problem = nt(m, n, k)
    ranked = [c for _, c in ranked_configs(problem)]
    config = choose_config(problem)
    assert config == ranked[0] and config.split_k and config.block_n == DECODE_SPLIT_BLOCK_N
    plain = ranked[1]  # the model's plain pick follows its split build, then the other split widths
    assert not plain.split_k and plain.block_n <= DECODE_SPLIT_MAX_BLOCK_N and plain.block_m == config.block_m
    assert all(c.split_k and c.block_n in DECODE_SPLIT_TUNER_BLOCK_N for c in ranked[2:4] if c.split_k)
    assert ranked.count(config) == 1
    tiles = ceil_div(m, config.block_m) * ceil_div(n, config.block_n)
    assert 2 * tiles <= 132 and split_k_ranges(problem, config.block_m, config.block_n) > 1


@pytest.mark.parametrize("m,n,k", [(64, 4096, 7168), (64, 7168, 2048), (64, 7168, 16384), (128, 4096, 7168)])
def test_wider_decode_picks_that_fill_a_quarter_of_the_sms_stay_unsplit(m: int, n: int, k: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # decode_split decides on the larger-tile pick; the wave-fill tie-break may then take a narrower plain tile
    # (64 x 4096 x 7168: 64 x 32 on 128 tiles, level with 64 x 64 on an H100), never a split
    assert not choose_config(nt(m, n, k)).split_k
    monkeypatch.setattr(cost_model, "DECODE_FULL_FILL", 2.0)  # no tie-break: the larger-tile pick itself
    config = choose_config(nt(m, n, k))
    assert not config.split_k and config.block_n > DECODE_SPLIT_MAX_BLOCK_N
    assert split_k_ranges(nt(m, n, k), config.block_m, config.block_n) < DECODE_SPLIT_MIN_RANGES


def test_a_wide_pick_on_few_tiles_is_split_as_it_is() -> None:
    problem = Bf16Problem(64, 2112, 7168, False, True, 2, 0, 132)  # nn: B MN-major, 64-column tiles at least
    config = choose_config(problem)
    assert config.split_k and config.block_n == 64 and split_k_ranges(problem, 64, 64) >= DECODE_SPLIT_MIN_RANGES


@pytest.mark.parametrize("m", [256, 4096])
def test_no_split_k_past_decode_sizes(m: int) -> None:
    assert m > DECODE_MAX_M
    for n, k in [(2112, 7168), (4096, 7168), (7168, 16384)]:
        assert not any(c.split_k for _, c in ranked_configs(nt(m, n, k)))
        assert split_k_ranges(nt(m, n, k), 128, 256) == 1


def test_no_split_k_for_grouped_or_short_k() -> None:
    assert split_k_ranges(nt(64, 2112, 7168, groups=4), 64, 128) == 1
    assert not any(c.split_k for _, c in ranked_configs(nt(64, 2112, 7168, groups=4)))
    # 17 tiles of 64 x 128 on 132 SMs would take 7 ranges: 112 K blocks hold them, 16 do not
    assert split_tail_ranges(17, 132, 112) == 7 and split_k_ranges(nt(64, 2112, 7168), 64, 128) == 7
    assert split_k_ranges(nt(64, 2112, 1024), 64, 128) == 1
    assert ceil_div(1024, 64) < SPLIT_MIN_K_BLOCKS * 7
    # tiles filling more than half of the SMs: nothing splits
    assert split_k_ranges(nt(64, 2112, 7168), 64, 16) == 1


def test_split_build_holds_its_flags_in_shared_memory() -> None:
    assert bf16_smem_bytes(64, 128, 8, 2, True) == bf16_smem_bytes(64, 128, 8, 2) + SPLIT_FLAG_BYTES
    config = make_config(nt(64, 2112, 7168), 64, 128, split_k=True)
    assert config.split_k and "splitk" in config.label()
    assert config.smem_bytes(2) == bf16_smem_bytes(64, 128, config.num_stages, 2, True)


def test_grouped_specs_refuse_split_k() -> None:
    spec = grouped_spec(GemmKind.GROUPED_CONTIGUOUS, Bf16Geometry(512, 4), 4096, 7168, torch.bfloat16, None, 0,
                        132)
    with pytest.raises(ValueError, match="split-K"):
        dataclasses.replace(spec, config=dataclasses.replace(spec.config, split_k=True))


def test_tuned_split_k_round_trips_and_stands_only_where_it_splits(tmp_path: Path) -> None:
    db = TuningDB(tmp_path / "gpu.json")
    problem = nt(64, 2112, 7168)
    tuned = make_config(problem, 64, 64, split_k=True)
    db.record_bf16(problem, tuned, 12.0)
    assert TuningDB(tmp_path / "gpu.json").lookup_bf16(problem) == tuned
    # M = 33 shares the bucket: 64 x 64 tiles split there too, rebuilt for that M
    assert TuningDB(tmp_path / "gpu.json").lookup_bf16(nt(33, 2112, 7168)).split_k
    plain = make_config(problem, 64, 16)
    db.record_bf16(problem, plain, 20.0)
    assert not TuningDB(tmp_path / "gpu.json").lookup_bf16(problem).split_k
    # a split entry where its tile fills the SMs (132 tiles of 64 x 32 at M = 128) is rebuilt without the split
    wide = nt(128, 2112, 7168)
    db.record_bf16(wide, dataclasses.replace(make_config(wide, 64, 32), split_k=True), 15.0)
    looked_up = TuningDB(tmp_path / "gpu.json").lookup_bf16(wide)
    assert (looked_up.block_m, looked_up.block_n, looked_up.split_k) == (64, 32, False)


def test_the_tuner_also_times_the_other_split_widths() -> None:
    tt = Bf16Problem(16, 4096, 14336, True, False, 2, 0, 132)  # an MN-major A keeps the split there
    ranked = [c for _, c in ranked_configs(tt)]
    assert ranked[0].split_k and ranked[0].block_n == 64 and not ranked[1].split_k
    assert ranked[2].split_k and ranked[2].block_n == 128  # measured fastest there (44.0 against 46.0 us)
    assert not any(c.split_k for _, c in ranked_configs(nt(4096, 4096, 14336)))
