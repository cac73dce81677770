"""The tuning file: bucketing, round trips, validation of stored choices, and its use by the planner."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from deepgemm.api.gemm import planned_spec
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import choose_fp8_gemm_config, make_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import model_split_tail, split_tail_applies
from deepgemm.kernels.sm90_fp8_gemm_1d2d.smem import fp8_gemm_smem_bytes, max_stages
from deepgemm.kernels.sm90_bf16_gemm.cost_model import Bf16Problem
from deepgemm.tuning.db import entry_key, gpu_slug, m_bucket, tuning_db, TuningDB


def test_m_bucket_rounds_up_to_powers_of_two() -> None:
    assert [m_bucket(m) for m in (1, 2, 3, 64, 65, 128, 129, 4096, 4097)] == [1, 2, 4, 64, 128, 128, 256, 4096, 8192]


def test_gpu_slug() -> None:
    assert gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert gpu_slug("  ") == "gpu"


def test_round_trip_rebuilds_a_consistent_config(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tuned = make_config(4096, 2112, 7168, 128, 192, 132, 2, cluster_m=2)
    TuningDB(path).record(4096, 2112, 7168, 132, tuned, 123.0)
    config = TuningDB(path).lookup(3000, 2112, 7168, 132)  # same bucket (4096), fresh reader
    assert config is not None
    assert (config.block_m, config.block_n, config.cluster_m) == (128, 192, 2)
    assert config.num_stages == max_stages(128, 192, 7168, 2)
    assert config.smem_bytes == fp8_gemm_smem_bytes(128, 192, config.num_stages, 7168, 2)
    assert TuningDB(path).lookup(5000, 2112, 7168, 132) is None  # another bucket
    assert TuningDB(path).lookup(4096, 2112, 7168, 114) is None  # another SM count
    assert TuningDB(path).lookup(4096, 2112, 7168, 132, out_elem_bytes=4) is None


@pytest.mark.parametrize("entry", [
    {"block_m": 128, "block_n": 176, "cluster_m": 1},  # would span three scale blocks
    {"block_m": 96, "block_n": 128, "cluster_m": 1},   # not a kernel tile
    {"block_m": 128, "block_n": 136, "cluster_m": 2},  # multicast needs block_n % 16 == 0
    {"block_m": 128, "block_n": 128, "cluster_m": 3},
    {"block_m": 192, "block_n": 128, "cluster_m": 2},  # three math warpgroups never run as clusters
    {"block_m": "x", "block_n": 128, "cluster_m": 1},
    {"block_m": 256, "block_n": 128, "cluster_m": 1, "stream_tail": "false"},  # not a JSON bool
    {"block_m": 256, "block_n": 128, "cluster_m": 1, "split_tail": 1},  # not a JSON bool
    {"block_m": 256, "block_n": 128, "cluster_m": 1, "split_tail": True, "stream_tail": True},  # both tails
])
def test_invalid_entries_are_ignored(tmp_path: Path, entry: dict) -> None:
    path = tmp_path / "t.json"
    payload = {"format": "deepgemm-tuning", "version": 1,
               "entries": {entry_key(4096, 7168, 2, 132, 4096): {**entry, "median_us": 1.0, "measured_m": 4096}}}
    path.write_text(json.dumps(payload))
    assert TuningDB(path).lookup(4096, 4096, 7168, 132) is None


def test_block_m_192_entries_and_tuner_candidates_follow_the_model(tmp_path: Path) -> None:
    from deepgemm.tuning.tuner import candidate_configs

    path = tmp_path / "t.json"
    TuningDB(path).record(4096, 2112, 7168, 132, make_config(4096, 2112, 7168, 192, 128, 132, 2), 110.0)
    config = TuningDB(path).lookup(4096, 2112, 7168, 132)
    assert config is not None and config.block_m == 192 and config.cluster_m == 1
    assert config.split_tail  # block_m 192 is built as the split-tail kernel, as the model builds it
    assert model_split_tail(768, 3072, 7168, 192, 128, 132)
    candidates = candidate_configs(4096, 2112, 7168, 132, 2, top=6)
    assert any(c.block_m == 192 for c in candidates)
    assert all(c.cluster_m == 1 and (c.split_tail or c.stream_tail) for c in candidates if c.block_m == 192)
    # Other tiles get a split-tail variant next to the plain build only where it splits at this M.
    assert all(split_tail_applies(4096, 2112, 7168, c.block_m, c.block_n, 132)
               for c in candidates if c.block_m != 192 and c.split_tail)


def test_split_tail_choices_round_trip_and_the_tuner_times_split_k_at_decode_sizes(tmp_path: Path) -> None:
    from deepgemm.tuning.tuner import candidate_configs

    path = tmp_path / "t.json"
    split = make_config(64, 2112, 7168, 64, 32, 132, 2, cluster_m=1, split_tail=True)
    TuningDB(path).record(64, 2112, 7168, 132, split, 13.9)
    for m in (33, 64):  # one bucket; 66 tiles of 64 x 32 either way: two K ranges of 28 blocks
        config = TuningDB(path).lookup(m, 2112, 7168, 132)
        assert config == make_config(m, 2112, 7168, 64, 32, 132, 2, cluster_m=1, split_tail=True)
    assert json.loads(path.read_text())["entries"][entry_key(2112, 7168, 2, 132, 64)]["split_tail"] is True
    # In the 129..256 bucket 64 x 32 tiles split at M <= 192 (198 tiles: a last wave of 66) but not above
    # (264 tiles: two whole waves): there the entry gives the plain build of its tile.
    TuningDB(path).record(150, 2112, 7168, 132, make_config(150, 2112, 7168, 64, 32, 132, 2, cluster_m=1, split_tail=True), 20.0)
    assert TuningDB(path).lookup(192, 2112, 7168, 132).split_tail
    assert TuningDB(path).lookup(200, 2112, 7168, 132) == make_config(200, 2112, 7168, 64, 32, 132, 2, cluster_m=1)
    candidates = candidate_configs(64, 2112, 7168, 132, 2, top=6)
    splits = [c for c in candidates if c.split_tail]
    assert splits and all(split_tail_applies(64, 2112, 7168, c.block_m, c.block_n, 132) for c in splits)
    assert all(any(p.block_n == c.block_n and not p.split_tail for p in candidates) for c in splits)  # with its plain build


def test_corrupt_file_is_ignored_and_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text("{not json")
    db = TuningDB(path)
    assert db.lookup(64, 2112, 7168, 132) is None
    db.record(64, 2112, 7168, 132, make_config(64, 2112, 7168, 64, 32, 132), 15.0)
    assert json.loads(path.read_text())["format"] == "deepgemm-tuning"
    assert TuningDB(path).lookup(64, 2112, 7168, 132).block_n == 32


def test_concurrent_writers_keep_every_entry(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    shapes = [(64 * (i + 1), 4096, 7168) for i in range(8)]

    def write(shape: tuple[int, int, int]) -> None:
        m, n, k = shape
        TuningDB(path).record(m, n, k, 132, make_config(m, n, k, 64, 64, 132), float(m))

    threads = [threading.Thread(target=write, args=(shape,)) for shape in shapes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    db = TuningDB(path)
    assert len(db.entries()) == len({m_bucket(m) for m, _, _ in shapes})


def test_plan_spec_prefers_the_tuned_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    model = choose_fp8_gemm_config(4096, 2112, 7168, 132)
    tuned = make_config(4096, 2112, 7168, 128, 192, 132, cluster_m=2)
    assert model != tuned
    tuning_db("Fake GPU").record(4096, 2112, 7168, 132, tuned, 100.0)
    assert planned_spec(4096, 2112, 7168, torch.bfloat16, 132, "Fake GPU").config == tuned
    assert planned_spec(4096, 2112, 7168, torch.bfloat16, 132, "Other GPU").config == model
    assert planned_spec(4096, 2112, 7168, torch.bfloat16, 132).config == model
    assert (tmp_path / "tuning" / "fake-gpu.json").is_file()


def test_cli_tune_without_gpu_says_so(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "deepgemm", "tune", "--shape", "64,2112,7168"],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "DEEPGEMM_CACHE_DIR": str(tmp_path),
                                                               "HOME": str(tmp_path)}, timeout=120)
    assert proc.returncode == 1
    assert "needs an sm_90" in proc.stderr


def test_shipped_choices_are_valid_and_rebuild() -> None:
    files = sorted((Path(__file__).resolve().parents[2] / "deepgemm" / "tuning" / "tuned").glob("*.json"))
    assert files, "the package ships measured choices"
    for path in files:
        raw = json.loads(path.read_text())
        assert raw["format"] == "deepgemm-tuning" and raw["version"] == 1, path
        db = TuningDB(path)
        assert len(db.entries()) == len(raw["entries"]), f"{path}: an entry does not parse"
        for key, choice in db.entries().items():
            fields = dict(part.split("=") for part in key.split("|")[1:])
            n, k, out, sms = (int(fields[name]) for name in ("n", "k", "out", "sms"))
            if key.startswith("bf16_gemm_"):  # bf16_gemm_<layout>|c=<addend bytes>|...
                layout = key.split("|")[0].removeprefix("bf16_gemm_")
                problem = Bf16Problem(choice.measured_m, n, k, layout[0] == "t", layout[1] == "n", out,
                                      int(fields["c"]), sms)
                bf16 = db.lookup_bf16(problem)
                assert bf16 is not None, f"{path}: {key} is rejected by the rebuild checks"
                assert (bf16.block_m, bf16.block_n, bf16.split_k) == (choice.block_m, choice.block_n, choice.split_tail), \
                    f"{path}: {key} does not rebuild as measured (a split-K entry must split at its M)"
                continue
            config = db.lookup(choice.measured_m, n, k, sms, out)
            assert config is not None, f"{path}: {key} is rejected by the rebuild checks"
            assert (config.block_m, config.block_n, config.cluster_m) == (choice.block_m, choice.block_n, choice.cluster_m)
            assert config.stream_tail == choice.stream_tail, f"{path}: {key}'s stream tail does not split at its M"
            assert config.split_tail == choice.split_tail, f"{path}: {key}'s split tail does not split at its M"


def test_shipped_choice_backs_the_users_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    model = choose_fp8_gemm_config(4096, 2112, 7168, 132)
    shipped = planned_spec(4096, 2112, 7168, torch.bfloat16, 132, "NVIDIA H200").config
    # Measured on the H200: 128 x 192 tiles (2.7 waves) run 105 us where the model's pick runs 116-123, and
    # 104.4 with the stream tail (the 88 tiles of the last wave cut at K block 39, ends on the 44 idle CTAs).
    assert (shipped.block_m, shipped.block_n, shipped.stream_tail) == (128, 192, True) and shipped != model
    assert planned_spec(4096, 2112, 7168, torch.bfloat16, 114, "NVIDIA H200").config == choose_fp8_gemm_config(
        4096, 2112, 7168, 114)  # another SM count: the model
    # Decode sizes of the same N and K: split-K (the model's 64 x 16 tiles ran 15.6 us; 64 x 32 split into two
    # K ranges 13.9, and for M in 65..128, 64 x 64 split in two 14.4 against 15.8, in CUDA graphs).
    for m, block_n in ((64, 32), (128, 64)):
        decode = planned_spec(m, 2112, 7168, torch.bfloat16, 132, "NVIDIA H200").config
        assert (decode.block_m, decode.block_n, decode.split_tail) == (64, block_n, True)
    # The user's own measurement wins over the shipped one, and is written to the user's file only.
    own = make_config(4096, 2112, 7168, 128, 128, 132)
    tuning_db("NVIDIA H200").record(4096, 2112, 7168, 132, own, 90.0)
    assert planned_spec(4096, 2112, 7168, torch.bfloat16, 132, "NVIDIA H200").config == own
    assert (tmp_path / "tuning" / "nvidia-h200.json").is_file()


@pytest.mark.parametrize("m,block_n", [(1, 16), (2, 16), (8, 16), (16, 16), (32, 16), (64, 16), (128, 32)])
def test_h100_plain_narrow_tiles_at_n2112(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, m: int, block_n: int) -> None:
    """On an H100 the plain 64 x 16 (64 x 32 at M = 128) with the elected TMA producer runs 14.6-14.9 us at M <= 64
    against 15.6-16.0 for the model's split-K pick (15.5 against 16.6 at M = 128), and level or ahead after a reading
    flush; the H100 table ships them. The H200 plans the model's split (measured ahead there)."""
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))  # no user records
    h100 = planned_spec(m, 2112, 7168, torch.bfloat16, 132, "NVIDIA H100 80GB HBM3").config
    assert (h100.block_m, h100.block_n, h100.split_tail) == (64, block_n, False)
    h200 = planned_spec(m, 2112, 7168, torch.bfloat16, 132, "NVIDIA H200").config
    assert h200 == choose_fp8_gemm_config(m, 2112, 7168, 132) and h200.split_tail
