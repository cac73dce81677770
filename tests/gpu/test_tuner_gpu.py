"""Autotuner on the GPU: measures candidates, records the winner, and the planner then uses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import deepgemm
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan
from deepgemm.tuning.db import TuningDB
from deepgemm.tuning.tuner import tune_fp8_gemm_nt
from tests.helpers import assert_close_to_reference, random_operands, reference_abs_fp64, reference_fp64

pytestmark = pytest.mark.gpu


def test_tune_records_a_winner_the_planner_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    m, n, k = 200, 1536, 1024  # a shape no other test plans, so no cached plan hides the lookup
    result = tune_fp8_gemm_nt(m, n, k, top=2, iters=5)
    assert len(result.timings_us) >= 2 and result.timings_us[0][0] == result.best
    assert all(us > 0 for _, us in result.timings_us)
    assert TuningDB(Path(result.db_path)).lookup(m, n, k, result.best.num_sms) == result.best
    assert get_plan(0, m, n, k, torch.bfloat16).spec.config == result.best
    a, b = random_operands(m, n, k, "cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.fp8_gemm_nt(a, b, out)
    assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b))
