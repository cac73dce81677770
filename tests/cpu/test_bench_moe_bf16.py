"""The MoE suite in BF16 (`deepgemm bench --suite deepseek-v3-moe --dtype bf16`): its cases (the FP8 suite's 14
m-grouped ones plus issue 23's 4 k-grouped weight gradients), their operands and float64 references, and the three implementations it times —
deepgemm's grouped BF16 GEMMs (CPU reference path), a stand-in DeepGEMM and torch._grouped_mm — each checked against
that reference through the benchmark's own preparation."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from deepgemm.bench import deepseek
from deepgemm.bench.moe_cases import MoeCase, deepseek_v3_moe, moe_suite
from deepgemm.bench.moe_inputs import make_moe_problem
from deepgemm.bench.moe_peers import (
    DEEPGEMM_MOE_BF16,
    DEEPSEEK_MOE_BF16,
    MOE_BF16_IMPLEMENTATIONS,
    TORCH_GROUPED_MM,
    moe_implementations,
)
from deepgemm.bench.peers import Unavailable
from deepgemm.bench.results import CALC_DIFF_TOLERANCE, Measurement
from deepgemm.bench.runner import runnable
from deepgemm.utils import calc_diff

SEED = 11
CASES = [
    MoeCase("contiguous", 3, 80, (100, 37, 130), 256, 384),
    MoeCase("masked", 3, 40, (5, 64, 1), 136, 256, max_m=64),
    MoeCase("k-grouped", 3, 256, (128, 384, 0), 136, 512, m=72),
]


@pytest.fixture(autouse=True)
def fresh_import() -> Iterator[None]:
    deepseek.load.cache_clear()
    yield
    deepseek.load.cache_clear()


def test_bf16_suite_is_the_fp8_ones_m_grouped_cases_plus_its_own_weight_gradients() -> None:
    fp8, bf16 = deepseek_v3_moe(), deepseek_v3_moe(precision="bf16")
    assert moe_suite("deepseek-v3-moe", "bf16") == bf16 and moe_suite("deepseek-v3-moe") == fp8
    assert bf16[:14] == fp8[:14] and len(bf16) == 18 and len({c.shape for c in bf16}) == 18
    assert bf16[14:] != fp8[14:]
    k_grouped = bf16[14:]
    assert [c.label for c in k_grouped] == ["k-grouped 4x~4096 M=4096 N=4096", "k-grouped 4x~4096 M=7168 N=7168",
                                           "k-grouped 8x~4096 M=4096 N=4096", "k-grouped 8x~4096 M=7168 N=7168"]
    for case in k_grouped:
        assert case.kind == "k-grouped" and case.m == case.n and case.shape == (case.m, case.n, sum(case.counts))
        assert all(t % 128 == 0 and round(0.7 * 4096 / 128) * 128 <= t <= round(1.3 * 4096 / 128) * 128
                   for t in case.counts)
    assert k_grouped[0].counts == (4352, 4992, 4864, 4480)  # seed 0, drawn after the m-grouped cases


def test_dev_bench_grouped_bf16_draws_the_suites_counts() -> None:
    """dev/bench_grouped_bf16.py (its psum column and JSON) times the same token counts as the BF16 suite."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from dev.bench_grouped_bf16 import build_cases

    dev_cases = build_cases(0)
    suite = deepseek_v3_moe(precision="bf16")
    assert [c.counts for c in dev_cases] == [c.counts for c in suite]
    assert [c.label for c in dev_cases] == [c.label for c in suite]


def test_bf16_bytes_count_two_byte_operands_and_the_fp32_accumulation() -> None:
    masked = MoeCase("masked", 2, 64, (10, 20), 256, 384, max_m=64)
    assert masked.hbm_bytes("bf16") == 2 * (30 * 384 + 2 * 256 * 384 + 30 * 256)
    k_grouped = MoeCase("k-grouped", 2, 128, (128, 256), 136, 384, m=72)
    assert k_grouped.hbm_bytes("bf16") == 2 * 384 * (72 + 136) + 2 * 4 * 2 * 72 * 136  # out read and written
    row = Measurement(72, 136, 384, "deepgemm-bf16", "bf16", "ok", case=k_grouped.label)
    assert row.where == "k-grouped 2x~128 M=72 N=136 (384 tokens)"
    assert Measurement(30, 256, 384, "x", "bf16", "ok", case=masked.label).where.endswith("(30 rows)")


def _stand_in() -> tuple[types.ModuleType, list[tuple]]:
    """A deep_gemm with DeepGEMM's grouped BF16 signatures, computing each in float64 and recording its calls."""
    calls: list[tuple] = []
    module = types.ModuleType("deep_gemm")
    module.__version__ = "0.0-test"  # type: ignore[attr-defined]

    def m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices):  # noqa: ANN001, ANN202
        calls.append(("contiguous", m_indices.dtype))
        for row, group in enumerate(m_indices.tolist()):
            if group >= 0:
                d[row] = (a[row].double() @ b[group].double().t()).to(d.dtype)

    def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m):  # noqa: ANN001, ANN202
        calls.append(("masked", expected_m))
        for group, rows in enumerate(masked_m.tolist()):
            d[group, :rows] = (a[group, :rows].double() @ b[group].double().t()).to(d.dtype)

    def k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, ks_tensor, c):  # noqa: ANN001, ANN202
        calls.append(("k-grouped", list(ks), ks_tensor.tolist(), ks_tensor.dtype, c is d))
        first = 0
        for group, tokens in enumerate(ks):
            d[group] = c[group] + (a[first:first + tokens].double().t() @ b[first:first + tokens].double()).float()
            first += tokens

    module.m_grouped_bf16_gemm_nt_contiguous = m_grouped_bf16_gemm_nt_contiguous  # type: ignore[attr-defined]
    module.m_grouped_bf16_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked  # type: ignore[attr-defined]
    module.k_grouped_bf16_gemm_tn_contiguous = k_grouped_bf16_gemm_tn_contiguous  # type: ignore[attr-defined]
    module.get_mk_alignment_for_contiguous_layout = lambda: 128  # type: ignore[attr-defined]
    return module, calls


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.kind)
def test_every_implementation_matches_the_float64_reference(monkeypatch: pytest.MonkeyPatch, case: MoeCase) -> None:
    """deepgemm (its CPU reference path), the stand-in DeepGEMM and torch._grouped_mm, each prepared by the benchmark,
    against the problem's float64 reference on the rows their selection picks."""
    print(f"seed {SEED}")
    module, calls = _stand_in()
    monkeypatch.setitem(sys.modules, "deep_gemm", module)
    assert moe_implementations("bf16") == MOE_BF16_IMPLEMENTATIONS
    assert [impl.name for impl in runnable(MOE_BF16_IMPLEMENTATIONS)[0]] == [
        "deepgemm-bf16", "deepseek-deepgemm-bf16", "torch-grouped-mm"]
    assert len({impl.operation for impl in MOE_BF16_IMPLEMENTATIONS}) == 1  # timed interleaved
    problem = make_moe_problem(case, device="cpu", seed=SEED, precision="bf16")
    assert problem.precision == "bf16" and problem.shape == case.shape
    for impl in MOE_BF16_IMPLEMENTATIONS:
        if impl is TORCH_GROUPED_MM and not hasattr(torch, "_grouped_mm"):
            with pytest.raises(Unavailable, match="no torch._grouped_mm"):
                impl.prepare(problem)
            continue
        prepared = impl.prepare(problem)
        out = prepared.fn()
        picked = out if prepared.select is None else prepared.select(out)
        reference = prepared.reference()
        assert picked.shape == reference.shape, impl.name
        assert calc_diff(picked, reference) < 1e-4, impl.name
        if impl is not TORCH_GROUPED_MM:
            assert prepared.bytes == case.hbm_bytes("bf16")
    assert [call[0] for call in calls] == [case.kind]


def test_k_grouped_calls_add_into_out_and_the_check_would_see_a_dropped_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """k-grouped runs C = out in place: the first call leaves addend + A_g^T B_g (the reference), the next adds again.
    The addend is as large as the product, so a call that ignored C would fail the benchmark's accuracy check; an
    empty expert's output is its addend unchanged. DeepGEMM gets ks on the device as int32 and c = d."""
    case = CASES[2]
    module, calls = _stand_in()
    monkeypatch.setitem(sys.modules, "deep_gemm", module)
    problem = make_moe_problem(case, device="cpu", seed=SEED, precision="bf16")
    reference, product = problem.reference(), problem.product_reference()
    assert calc_diff(problem.addend.double(), reference) > 100 * CALC_DIFF_TOLERANCE
    assert calc_diff(product, reference) > 100 * CALC_DIFF_TOLERANCE
    assert torch.equal(reference[2], problem.addend[2].double())  # the expert with no tokens
    for impl in (DEEPGEMM_MOE_BF16, DEEPSEEK_MOE_BF16):
        prepared = impl.prepare(problem)
        first = prepared.fn().clone()
        assert calc_diff(first, reference) < 1e-4, impl.name
        second = prepared.fn()
        assert calc_diff(second, reference + product) < 1e-4, impl.name
        assert "C = out" in prepared.note
    assert calls[0] == ("k-grouped", [128, 384, 0], [128, 384, 0], torch.int32, True)


def test_masked_and_contiguous_outputs_are_poisoned_and_only_valid_rows_compared() -> None:
    """The outputs start as NaN, so a valid row a call leaves unwritten fails the check; the selection covers exactly
    the valid rows (what the API leaves in padding rows and slots past masked_m is not compared)."""
    for case in CASES[:2]:
        problem = make_moe_problem(case, device="cpu", seed=SEED, precision="bf16")
        out = problem.output()
        assert out.dtype == torch.bfloat16 and bool(out.isnan().all())
        prepared = DEEPGEMM_MOE_BF16.prepare(problem)
        result = prepared.fn()
        assert prepared.select is not None and int(problem.valid_rows.sum()) == case.valid_rows
        assert not bool(prepared.select(result).isnan().any())
        assert prepared.select(result).shape == (case.valid_rows, case.n)


def test_deepgemm_peer_missing_or_lacking_a_form_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = make_moe_problem(CASES[1], device="cpu", seed=SEED, precision="bf16")
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # type: ignore[arg-type]
    assert "deepseek-deepgemm-bf16" in runnable(MOE_BF16_IMPLEMENTATIONS)[1]
    with pytest.raises(Unavailable, match="not importable"):
        DEEPSEEK_MOE_BF16.prepare(problem)
    deepseek.load.cache_clear()
    module = types.ModuleType("deep_gemm")
    monkeypatch.setitem(sys.modules, "deep_gemm", module)
    with pytest.raises(Unavailable, match="has no m_grouped_bf16_gemm_nt_masked"):
        DEEPSEEK_MOE_BF16.prepare(problem)


def test_cli_times_the_bf16_suite_and_a_comparison_reruns_it_in_bf16(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--suite deepseek-v3-moe --dtype bf16` times the 18 BF16 cases; `--compare` with that baseline re-runs them in
    BF16 without --dtype (the baseline's settings say it); a baseline naming an unknown dtype is refused."""
    from deepgemm.analysis.roofline import Ceilings
    from deepgemm.bench.results import BenchResults
    from deepgemm.cli import main
    from deepgemm.commands import bench

    monkeypatch.setattr(bench, "cuda_device_problem", lambda: None)
    cases = deepseek_v3_moe(precision="bf16")
    seen: list[tuple[list[tuple[int, int, int]], str | None, str]] = []

    def fake_measure(args, shapes, gpu, moe):  # noqa: ANN001, ANN202
        seen.append((shapes, moe, args.dtype))
        rows = [Measurement(*case.shape, impl=impl, precision="bf16", status="ok", median_us=us, min_us=us,
                            p10_us=us, p90_us=us, samples=30, calc_diff=1e-6, bytes=case.hbm_bytes("bf16"),
                            case=case.label)
                for case in cases for impl, us in (("deepgemm-bf16", 100.0), ("torch-grouped-mm", 104.0))]
        return BenchResults(Ceilings(800.0, 1500.0, 4000.0, "test"), rows, {"device": "NVIDIA H200"},
                            {"suite": moe, "dtype": args.dtype, "layout": args.layout})

    monkeypatch.setattr(bench, "_measure", fake_measure)
    stored = tmp_path / "moe-bf16.json"
    assert main(["bench", "--suite", "deepseek-v3-moe", "--dtype", "bf16", "--json", str(stored),
                 "--markdown", str(tmp_path / "m.md")]) == 0
    assert seen[-1] == ([case.shape for case in cases], "deepseek-v3-moe", "bf16")
    assert "k-grouped 8x~4096 M=7168 N=7168 (30464 tokens)" in (tmp_path / "m.md").read_text()
    assert main(["bench", "--compare", str(stored), "--relative-to", "torch-grouped-mm",
                 "--json", str(tmp_path / "again.json"), "--markdown", str(tmp_path / "again.md")]) == 0
    assert seen[-1] == ([case.shape for case in cases], "deepseek-v3-moe", "bf16")
    capsys.readouterr()
    document = BenchResults.load(stored).to_json()
    document["settings"]["dtype"] = "fp4"
    bogus = tmp_path / "bogus.json"
    import json

    bogus.write_text(json.dumps(document))
    assert main(["bench", "--compare", str(bogus)]) == 2
    assert "settings.dtype 'fp4' is not one of fp8, bf16" in capsys.readouterr().err
