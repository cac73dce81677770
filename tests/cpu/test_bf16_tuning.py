"""BF16 tuning: the model's ranked candidates, tuning-file entries per layout and addend (round trip, re-checks,
fallback), the tuner's choice with the timing faked, and the API planning with the tuned tile (plan creation faked:
no GPU here)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deepgemm.api import bf16 as bf16_api
from deepgemm.api.tuned import TunedLookups
from deepgemm.kernels.sm90_bf16_gemm.cost_model import (
    Bf16Problem,
    choose_config,
    make_config,
    ranked_configs,
)
from deepgemm.tuning import bf16_tuner
from deepgemm.tuning.db import TuningDB
from deepgemm.tuning.timing import Timing

NT = Bf16Problem(4096, 7168, 16384, False, False, 2, 0, 132)
NN_FP32_C = Bf16Problem(128, 2112, 7168, False, True, 4, 4, 132)


@pytest.mark.parametrize("problem", [NT, NN_FP32_C, Bf16Problem(1, 8, 8, True, False, 2, 2, 78)])
def test_ranked_configs_start_with_the_models_choice(problem: Bf16Problem) -> None:
    ranked = ranked_configs(problem)
    assert ranked and ranked[0][1] == choose_config(problem)
    assert [s for s, _ in ranked] == sorted(s for s, _ in ranked)
    step = 64 if problem.b_mn_major else 16
    assert all(c.block_n % step == 0 and c.block_m in (64, 128) and c.num_stages >= 3 for _, c in ranked)


def test_entries_round_trip_per_layout_and_addend(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    db = TuningDB(path)
    tuned = make_config(NT, 128, 256)
    assert tuned != choose_config(NT)
    db.record_bf16(NT, tuned, 1300.0)
    fresh = TuningDB(path)
    assert fresh.lookup_bf16(NT) == tuned
    assert fresh.lookup_bf16(Bf16Problem(3000, 7168, 16384, False, False, 2, 0, 132)) == make_config(
        Bf16Problem(3000, 7168, 16384, False, False, 2, 0, 132), 128, 256)  # same M bucket, rebuilt for this M
    for other in (Bf16Problem(4096, 7168, 16384, True, False, 2, 0, 132),   # tn: another kernel
                  Bf16Problem(4096, 7168, 16384, False, False, 2, 2, 132),  # with a BF16 C
                  Bf16Problem(4096, 7168, 16384, False, False, 4, 0, 132),  # FP32 out
                  Bf16Problem(4096, 7168, 16384, False, False, 2, 0, 66)):  # other SM count
        assert fresh.lookup_bf16(other) is None
    assert fresh.lookup(4096, 7168, 16384, 132) is None  # FP8 entries are apart
    keys = list(json.loads(path.read_text())["entries"])
    assert keys == ["bf16_gemm_nt|c=0|n=7168|k=16384|out=2|sms=132|m<=4096"]


def test_bad_entries_are_ignored_and_the_fallback_answers(tmp_path: Path) -> None:
    shipped = TuningDB(tmp_path / "shipped.json")
    shipped.record_bf16(NN_FP32_C, make_config(NN_FP32_C, 64, 128), 30.0)
    user_path = tmp_path / "user.json"
    user = TuningDB(user_path, fallback=shipped)
    assert user.lookup_bf16(NN_FP32_C) == make_config(NN_FP32_C, 64, 128)
    # block_n 96 is no whole number of 64-column atoms: an MN-major B (nn) cannot take it
    user.record_bf16(NN_FP32_C, make_config(Bf16Problem(128, 2112, 7168, False, False, 4, 4, 132), 64, 96), 25.0)
    assert TuningDB(user_path, fallback=shipped).lookup_bf16(NN_FP32_C) is None
    raw = json.loads(user_path.read_text())
    for entry in raw["entries"].values():
        entry["cluster_m"] = 2
    user_path.write_text(json.dumps(raw))
    assert TuningDB(user_path).lookup_bf16(NN_FP32_C) is None


def test_tuner_records_the_fastest_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU parts faked (plans compute on the CPU): every candidate is compiled and timed, its output checked
    against the float32 product; the fastest correct one is recorded, and a faster wrong one (never written, or
    wrong values) is left out with a warning."""
    from deepgemm.reference import bf16_gemm_reference

    db = TuningDB(tmp_path / "gpu.json")
    problem = Bf16Problem(64, 2112, 7168, False, False, 2, 0, 132)
    candidates = [c for _, c in ranked_configs(problem)[:4]]
    fastest, unwritten, wrong = candidates[2], candidates[0], candidates[3]
    compiled: list[object] = []
    timed: list[object] = []

    class Plan:
        def __init__(self, config: object) -> None:
            self.config = config

        def launch(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c: object) -> None:
            if self.config == unwritten:
                return
            product = bf16_gemm_reference(a, b, "nt")
            out.copy_(-product if self.config == wrong else product)

    def fake_bench(fn, **kwargs):  # noqa: ANN001, ANN003, ANN202
        config = current[0]
        fn()
        timed.append(config)
        us = 5.0 if config in (unwritten, wrong) else 10.0 if config == fastest else 20.0 + len(timed)
        return Timing.from_samples([us])

    current: list[object] = [None]

    def fake_plan(index, m, n, k, layout, out_dtype, c_dtype, config):  # noqa: ANN001, ANN202
        current[0] = config
        return Plan(config)

    monkeypatch.setattr(bf16_tuner.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bf16_tuner.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(bf16_tuner.torch.cuda, "get_device_name", lambda index=0: "Fake GPU")
    monkeypatch.setattr(bf16_tuner.torch.cuda, "device", lambda index: _Null())
    monkeypatch.setattr(bf16_tuner, "is_sm90", lambda index: True)
    monkeypatch.setattr(bf16_tuner, "sm_count", lambda index: 132)
    monkeypatch.setattr(bf16_tuner, "refuse_during_capture", lambda *args: None)
    monkeypatch.setattr(bf16_tuner, "compile_spec", lambda spec: compiled.append(spec.config))
    monkeypatch.setattr(bf16_tuner, "get_bf16_plan", fake_plan)
    monkeypatch.setattr(bf16_tuner, "bench_gpu", fake_bench)
    monkeypatch.setattr(bf16_tuner, "tuning_db", lambda name: db)
    real_empty = torch.empty
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: self.bfloat16())
    monkeypatch.setattr(bf16_tuner.torch, "empty", lambda *shape, dtype=None, device=None: real_empty(*shape, dtype=dtype))
    with pytest.warns(RuntimeWarning, match="left out 2 candidate"):
        result = bf16_tuner.tune_bf16_gemm("nt", 64, 2112, 7168, top=4)
    assert sorted(map(str, compiled)) == sorted(map(str, candidates))
    assert timed == candidates
    assert result.best == fastest and result.timings_us[0] == (fastest, 10.0)
    assert [c for c, _ in result.rejected] == [unwritten, wrong]
    assert math.isnan(result.rejected[0][1]) and result.rejected[1][1] > 0.5  # never written; the negated product
    assert TuningDB(db.path).lookup_bf16(problem) == fastest


def test_the_correctness_gate_warns_and_refuses_when_nothing_passes() -> None:
    from deepgemm.errors import DeepGemmError
    from deepgemm.tuning.verify import MAX_CALC_DIFF, candidate_error, settle

    reference = torch.randn(32, 48, dtype=torch.float64)
    assert candidate_error(reference.bfloat16(), reference) is None  # BF16 output rounding passes
    big = torch.randn(1024, 1024, dtype=torch.float64)
    one_wrong_tile = big.bfloat16().clone()
    one_wrong_tile[128:256, 384:512] = 0  # 1 of 64 tiles never added up
    assert candidate_error(big.bfloat16(), big) is None and candidate_error(one_wrong_tile, big) > MAX_CALC_DIFF
    one_wrong_row = big.float().clone()
    one_wrong_row[7] *= -1
    assert candidate_error(one_wrong_row, big) > MAX_CALC_DIFF
    assert candidate_error(reference.bfloat16() * 1.1, reference) > MAX_CALC_DIFF  # a 10% scale error: 4.5e-3
    assert candidate_error(torch.zeros(32, 48), reference) == pytest.approx(1.0)
    assert math.isnan(candidate_error(torch.full((32, 48), float("nan")), reference))
    config = make_config(NT, 128, 256)
    settle("bf16_gemm_nt", [(config, 1.0)], [], "m=1")  # nothing rejected: silent
    with pytest.warns(RuntimeWarning, match="bm128 bn256"):
        settle("bf16_gemm_nt", [(config, 1.0)], [(config, 0.5)], "m=1")
    with pytest.raises(DeepGemmError, match="every candidate's output was wrong.*NaN"):
        settle("bf16_gemm_nt", [], [(config, float("nan"))], "m=1")


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: object) -> None:
        return None


def test_the_api_plans_with_the_tuned_tile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16_gemm's kernel path asks the tuning file first (once per shape), then passes the choice to the plan."""
    db = TuningDB(tmp_path / "gpu.json")
    problem = Bf16Problem(256, 2112, 7168, True, True, 2, 0, 132)  # tn
    tuned = make_config(problem, 128, 64)
    db.record_bf16(problem, tuned, 50.0)
    planned: list[object] = []

    class Plan:
        def packed_args(self, *args: object) -> object:
            return object()

        def launch_packed(self, args: object) -> None:
            pass

    def fake_plan(index, m, n, k, layout, out_dtype, c_dtype, config=None):  # noqa: ANN001, ANN202
        planned.append((layout, config))
        return Plan()

    monkeypatch.setattr(bf16_api, "backend_for", lambda *tensors, **kw: "sm90")
    monkeypatch.setattr(bf16_api, "get_bf16_plan", fake_plan)
    monkeypatch.setattr(bf16_api, "tuning_db", lambda name: db)
    monkeypatch.setattr(bf16_api, "device_name", lambda index: "Fake GPU")
    monkeypatch.setattr(bf16_api, "sm_count", lambda index: 132)
    monkeypatch.setattr(bf16_api, "_tuned", TunedLookups())
    monkeypatch.setattr(bf16_api, "_ready", {})
    monkeypatch.setattr(bf16_api, "_fresh", {})
    a = torch.randn(7168, 256).to(torch.bfloat16)
    b = torch.randn(7168, 2112).to(torch.bfloat16)
    bf16_api.bf16_gemm("tn", a, b)
    bf16_api.bf16_gemm("nt", a.t().contiguous(), b.t().contiguous())  # untuned layout: the cost model (None)
    assert planned == [("tn", tuned), ("nt", None)]


def test_cli_tune_rejects_a_layout_without_bf16(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "deepgemm", "tune", "--shape", "64,2112,7168", "--layout", "tn"],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "DEEPGEMM_CACHE_DIR": str(tmp_path),
                                                               "HOME": str(tmp_path)}, timeout=120)
    assert proc.returncode == 2 and "--layout is for --dtype bf16" in proc.stderr


@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
@pytest.mark.parametrize("layout,m,n,k,tile", [
    ("nt", 128, 7168, 16384, (64, 128, False)),   # H100 92.6 against the model's 128 x 96, 95.9 us
    ("tt", 128, 7168, 2048, (64, 128, False)),    # H100 20.4 against 20.7
    ("nn", 128, 2112, 7168, (64, 64, True)),      # H100 24.1 against the model's plain 64 x 64, 25.5
    ("tn", 128, 24576, 1536, (64, 192, False)),   # H100 39.6 against the model's 128 x 256, 42.0
])
def test_shipped_decode_tiles_per_gpu_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: str, layout: str,
                                            m: int, n: int, k: int, tile: tuple[int, int, bool]) -> None:
    """The H100 and H200 tables ship the same measured decode tiles (block_m 64 where the model picks 128, split-K
    at N = 2112), each measured on its own GPU against the model's pick (docs/performance.md, BF16 levers); another
    GPU model plans with the cost model."""
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))  # no user records
    planned = bf16_api.precompile_bf16_gemm(layout, m, n, k, num_sms=132, gpu=gpu).config
    assert (planned.block_m, planned.block_n, planned.split_k) == tile
    model = bf16_api.precompile_bf16_gemm(layout, m, n, k, num_sms=132, gpu="NVIDIA H20").config
    assert model == choose_config(Bf16Problem(m, n, k, layout[0] == "t", layout[1] == "n", 2, 0, 132))
    assert (model.block_m, model.block_n, model.split_k) != tile


@pytest.mark.parametrize("layout,m,n,k,tile", [
    ("nn", 128, 14336, 4096, (64, 256)),  # H100 54.2 against the model's 128 x 192 (75 tiles), 55.4 us
    ("tn", 128, 14336, 4096, (64, 256)),  # 54.3 against 55.6
    ("nn", 64, 14336, 4096, (64, 128)),   # 52.9 against the model's 64 x 256, 53.7
    ("nn", 64, 7168, 2048, (64, 64)),     # 19.6 against the model's 64 x 128, 19.9
])
def test_h100_entries_for_grids_below_the_decode_fill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str,
                                                      m: int, n: int, k: int, tile: tuple[int, int]) -> None:
    """Tiles on 112 of 132 SMs, below the model's decode fill (0.9) but faster on the H100, ship as H100 entries; the
    H200 has none for them and plans with the model."""
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))  # no user records
    h100 = bf16_api.precompile_bf16_gemm(layout, m, n, k, num_sms=132, gpu="NVIDIA H100 80GB HBM3").config
    assert (h100.block_m, h100.block_n, h100.split_k) == (*tile, False)
    h200 = bf16_api.precompile_bf16_gemm(layout, m, n, k, num_sms=132, gpu="NVIDIA H200").config
    assert h200 == choose_config(Bf16Problem(m, n, k, layout[0] == "t", layout[1] == "n", 2, 0, 132))
    assert (h200.block_m, h200.block_n) != tile
