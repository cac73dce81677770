"""Autotuner on the GPU: measures candidates, records the winner, and the planner then uses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import deepgemm
from deepgemm.tuning.db import TuningDB
from deepgemm.tuning.tuner import tune_fp8_gemm_nt
from tests.helpers import assert_close_to_reference, random_operands, reference_abs_fp64, reference_fp64

pytestmark = pytest.mark.gpu


def test_tune_records_a_winner_the_planner_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deepgemm.api import gemm as gemm_api
    from deepgemm.api.tuned import TunedLookups
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import _plans

    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemm_api, "_tuned", TunedLookups())  # no lookup memoized before the tuning
    monkeypatch.setattr(gemm_api, "_ready", {})
    m, n, k = 200, 1536, 1024
    result = tune_fp8_gemm_nt(m, n, k, top=2, iters=5)
    assert len(result.timings_us) >= 2 and result.timings_us[0][0] == result.best and result.rejected == ()
    assert all(us > 0 for _, us in result.timings_us)
    assert TuningDB(Path(result.db_path)).lookup(m, n, k, result.best.num_sms) == result.best
    # The API plans with the winner, whichever candidate won (get_plan without a config is the cost model's).
    assert gemm_api.tuned_config(0, m, n, k, torch.bfloat16) == result.best
    a, b = random_operands(m, n, k, "cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.fp8_gemm_nt(a, b, out)
    assert any(key[:4] == (0, m, n, k) and key[5] == result.best for key in _plans)
    assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b))


def test_bf16_tune_records_a_winner_the_api_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    from deepgemm.api import bf16 as bf16_api
    from deepgemm.api.tuned import TunedLookups
    from deepgemm.kernels.sm90_bf16_gemm.plan import _plans, bf16_problem
    from deepgemm.reference import bf16_gemm_reference
    from deepgemm.tuning.bf16_tuner import tune_bf16_gemm

    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(bf16_api, "_tuned", TunedLookups())
    monkeypatch.setattr(bf16_api, "_ready", {})
    m, n, k = 200, 1536, 1024  # tn: A [K, M], B [K, N]
    result = tune_bf16_gemm("tn", m, n, k, top=3, iters=5)
    assert len(result.timings_us) == 3 and result.timings_us[0][0] == result.best and result.rejected == ()
    problem = bf16_problem(m, n, k, "tn", torch.bfloat16, None, result.best.num_sms)
    assert TuningDB(Path(result.db_path)).lookup_bf16(problem) == result.best
    a = torch.randn(k, m, device="cuda").to(torch.bfloat16)
    b = torch.randn(k, n, device="cuda").to(torch.bfloat16)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.bf16_gemm_tn(a, b, out)
    assert any(key[:5] == (0, m, n, k, "tn") and key[-1] == result.best for key in _plans)
    assert deepgemm.calc_diff(out.double(), bf16_gemm_reference(a, b, "tn", None, torch.float64)) < 2e-5
