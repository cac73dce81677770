"""The MoE suite of `deepgemm bench`: its cases, their operands and float64 reference, and deepgemm's grouped GEMM
checked against that reference through the benchmark's own preparation (CPU reference path)."""

from __future__ import annotations

import pytest
import torch

from deepgemm.bench.moe_cases import MoeCase, deepseek_v3_moe, is_moe_suite, moe_suite
from deepgemm.bench.moe_inputs import make_moe_problem
from deepgemm.bench.moe_peers import DEEPGEMM_MOE
from deepgemm.utils import calc_diff

SEED = 5


def test_suite_cases_are_fixed_and_distinct() -> None:
    cases = deepseek_v3_moe()
    assert cases == moe_suite("DeepSeek-V3-MoE") and is_moe_suite("deepseek-v3-moe") and not is_moe_suite("deepseek-v3")
    kinds = [c.kind for c in cases]
    assert (kinds.count("contiguous"), kinds.count("masked"), kinds.count("k-grouped")) == (4, 10, 4)
    assert len({c.shape for c in cases}) == len(cases)
    for case in cases:
        low, high = round(0.7 * case.expected_m), round(1.3 * case.expected_m)
        if case.kind == "k-grouped":  # tokens rounded to multiples of 128
            assert all(t % 128 == 0 and low - 64 <= t <= high + 64 for t in case.counts)
            assert case.shape == (case.m, case.n, sum(case.counts))
            continue
        assert all(max(1, low) <= c <= (min(high, case.max_m) if case.max_m else high) for c in case.counts)
        assert case.shape == (sum(case.counts), case.n, case.k)
    # FP8 Wgrad on the experts' own weights: gate/up dW [4096, 7168], down dW [7168, 2048].
    assert [(c.groups, c.m, c.n) for c in cases[14:]] == [(4, 4096, 7168), (4, 7168, 2048), (8, 4096, 7168),
                                                          (8, 7168, 2048)]
    # The first case's draw (seed 0): issue 5's counts, the ones dev/bench_grouped.py times.
    assert cases[0].label == "contiguous 4x~8192 N=4096 K=7168" and cases[0].valid_rows == 34154
    assert cases[4].label == "masked 1x~1024 (max_m 4096) N=4096 K=7168"


def test_contiguous_segments_are_padded_to_128_rows() -> None:
    case = MoeCase("contiguous", 3, 100, (100, 128, 1), 256, 256)
    rows = case.m_indices()
    assert len(rows) == 128 + 128 + 128
    assert rows[:100] == [0] * 100 and rows[100:128] == [-1] * 28 and rows[128:256] == [1] * 128
    assert rows[256] == 2 and rows[257:] == [-1] * 127


def test_hbm_bytes_count_valid_rows_weights_and_scales() -> None:
    case = MoeCase("masked", 2, 64, (10, 20), 256, 384, max_m=64)
    rows = 30
    scales = 4 * (rows * 3 + 2 * 2 * 3)
    assert case.hbm_bytes() == rows * 384 + 2 * 256 * 384 + 2 * rows * 256 + scales
    k_grouped = MoeCase("k-grouped", 2, 128, (128, 256), 136, 384, m=72)  # 3 token blocks of A and B, FP32 out
    assert k_grouped.hbm_bytes() == 384 * (72 + 136) + 4 * 3 * (72 + 136) + 2 * 4 * 2 * 72 * 136


@pytest.mark.parametrize("case", [
    MoeCase("contiguous", 3, 80, (100, 37, 130), 256, 384),
    MoeCase("masked", 3, 40, (5, 64, 0), 136, 256, max_m=64),
], ids=lambda c: c.kind)
def test_deepgemm_matches_the_float64_reference(case: MoeCase) -> None:
    """The benchmark's preparation of deepgemm's grouped GEMM (reference path on CPU) against the problem's float64
    reference, on the valid rows the selection picks; the poisoned rows outside them are never compared."""
    print(f"seed {SEED}")
    problem = make_moe_problem(case, device="cpu", seed=SEED)
    prepared = DEEPGEMM_MOE.prepare(problem)
    assert prepared.select is not None and prepared.bytes == case.hbm_bytes()
    out = prepared.fn()
    picked = prepared.select(out)
    reference = prepared.reference()
    assert picked.shape == reference.shape == (case.valid_rows, case.n)
    assert calc_diff(picked, reference) < 1e-4
    # The reference is each expert's own rows times its own weights: computed here directly for the second group.
    first = case.counts[0]
    a_exact = problem._exact_a[first:first + case.counts[1]]
    direct = a_exact @ problem.expert_weights(1).t()
    torch.testing.assert_close(reference[first:first + case.counts[1]], direct)
    # Swapping two experts' weights must change the reference (a check that would catch a group-blind reference).
    assert case.counts[1] == 0 or not torch.allclose(direct, a_exact @ problem.expert_weights(0).t())


def test_problem_reports_its_case() -> None:
    case = MoeCase("masked", 2, 16, (3, 7), 128, 128, max_m=16)
    problem = make_moe_problem(case, device="cpu", seed=SEED)
    assert (problem.m, problem.n, problem.k, problem.shape) == (10, 128, 128, (10, 128, 128))
    assert problem.label == case.label and problem.output().shape == (2, 16, 128)
    assert int(problem.valid_rows.sum()) == 10


def test_cli_routes_the_moe_suite(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    """`--suite deepseek-v3-moe` (and a baseline recorded from it) times the MoE cases; without a GPU, and with
    a --layout, it refuses with exit code 2 naming the argument."""
    from deepgemm.analysis.roofline import Ceilings
    from deepgemm.bench.results import BenchResults, Measurement
    from deepgemm.cli import main
    from deepgemm.commands import bench

    assert main(["bench", "--suite", "deepseek-v3-moe"]) == 2
    assert "argument --suite: deepseek-v3-moe needs a GPU" in capsys.readouterr().err
    monkeypatch.setattr(bench, "cuda_device_problem", lambda: None)
    assert main(["bench", "--suite", "deepseek-v3-moe", "--dtype", "bf16", "--layout", "tn"]) == 2
    assert "argument --layout: deepseek-v3-moe times the NT grouped GEMMs" in capsys.readouterr().err
    cases = deepseek_v3_moe()
    seen: list[tuple[list[tuple[int, int, int]], str | None]] = []

    def fake_measure(args, shapes, gpu, moe):  # noqa: ANN001, ANN202
        seen.append((shapes, moe))
        rows = [Measurement(*case.shape, impl=impl, precision="fp8", status="ok", median_us=us, min_us=us, p10_us=us,
                            p90_us=us, samples=30, calc_diff=1e-6, bytes=case.hbm_bytes(), case=case.label)
                for case in cases for impl, us in (("deepgemm", 100.0), ("deepseek-deepgemm", 95.0))]
        return BenchResults(Ceilings(800.0, 1500.0, 4000.0, "test"), rows, {"device": "NVIDIA H200"},
                            {"suite": moe, "dtype": "fp8", "layout": "nt"})

    monkeypatch.setattr(bench, "_measure", fake_measure)
    stored = tmp_path / "moe.json"
    assert main(["bench", "--suite", "deepseek-v3-moe", "--json", str(stored), "--markdown", str(tmp_path / "m.md")]) == 0
    assert seen[-1] == ([case.shape for case in cases], "deepseek-v3-moe")
    assert "masked 1x~1024 (max_m 4096) N=4096 K=7168 (1007 rows)" in (tmp_path / "m.md").read_text()
    reloaded = BenchResults.load(stored)
    assert reloaded.find(cases[0].shape, "deepgemm").case == cases[0].label  # the label survives the file
    # A comparison against that baseline re-runs the MoE suite (its settings name it), gated relative to DeepGEMM.
    assert main(["bench", "--compare", str(stored), "--relative-to", "deepseek-deepgemm",
                 "--json", str(tmp_path / "again.json"), "--markdown", str(tmp_path / "again.md")]) == 0
    assert seen[-1][1] == "deepseek-v3-moe"


def test_llm_prefill_suite_spans_the_models_fp8_layers() -> None:
    """The breadth suite: each listed model's FP8 linear layers (no LM head: it stays BF16) at M = 256, 4096, 32768."""
    from deepgemm.bench.suites import LLM_PREFILL_M_VALUES, model_linear_nk, suite_names, suite_shapes

    shapes = suite_shapes("llm-prefill")
    assert "llm-prefill" in suite_names() and len(shapes) >= 30 and len(set(shapes)) == len(shapes)
    assert {m for m, _, _ in shapes} == set(LLM_PREFILL_M_VALUES) == {256, 4096, 32768}
    assert (4096, 6144, 4096) in shapes and (32768, 57344, 8192) in shapes  # Llama-3 8B QKV, 70B gate/up
    assert (4096, 37888, 3584) in shapes and (256, 1536, 2048) in shapes  # Qwen2.5-7B gate/up, Qwen3 expert gate/up
    assert all(n not in (128256, 151936, 152064) for _, n, _ in shapes)  # LM heads left out
    assert (128256, 4096) in model_linear_nk("llama-3-8b") and (128256, 4096) not in model_linear_nk("llama-3-8b", fp8_only=True)


def test_dev_bench_grouped_draws_the_suites_counts() -> None:
    """dev/bench_grouped.py (and the tile A/B tools built on it) time the same token counts as the MoE suite."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from dev.bench_grouped import issue5_cases

    contiguous, masked = issue5_cases()
    m_grouped = deepseek_v3_moe()[:14]
    assert [tuple(c.counts) for c in contiguous + masked] == [c.counts for c in m_grouped]
    assert [c.label for c in contiguous + masked] == [c.label for c in m_grouped]


K_GROUPED = MoeCase("k-grouped", 3, 256, (128, 384, 0), 136, 512, m=72)


def _deepgemm_stand_in(calls: list[tuple]):  # noqa: ANN202 - a module
    """A deep_gemm whose k_grouped_fp8_gemm_nt_contiguous reads its operands as DeepGEMM's Hopper Wgrad does: each
    expert's [rows, k_g] e4m3 block K-major, back to back in one flat tensor, with [rows, K_total / 128] scales."""
    import types

    from deepgemm.bench.inputs import dequantize

    module = types.ModuleType("deep_gemm")
    module.__version__ = "0.0-test"  # type: ignore[attr-defined]

    def k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c):  # noqa: ANN001, ANN202
        calls.append((list(ks), ks_tensor.tolist(), ks_tensor.dtype, c is d, a[0].dim(), b[0].dim()))
        first = offset_a = offset_b = 0
        (flat_a, sfa), (flat_b, sfb) = a, b
        m, n = sfa.shape[0], sfb.shape[0]
        for group, tokens in enumerate(ks):
            block_a = flat_a[offset_a:offset_a + m * tokens].view(m, tokens)
            block_b = flat_b[offset_b:offset_b + n * tokens].view(n, tokens)
            blocks = slice(first // 128, (first + tokens) // 128)
            exact_a = dequantize(block_a, sfa[:, blocks], 128, 1)
            exact_b = dequantize(block_b, sfb[:, blocks], 128, 1)
            d[group] = c[group] + (exact_a @ exact_b.t()).float()
            first, offset_a, offset_b = first + tokens, offset_a + m * tokens, offset_b + n * tokens

    module.k_grouped_fp8_gemm_nt_contiguous = k_grouped_fp8_gemm_nt_contiguous  # type: ignore[attr-defined]
    module.get_mn_major_tma_aligned_tensor = lambda sf: sf  # type: ignore[attr-defined]
    return module


def test_k_grouped_fp8_implementations_match_the_float64_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """deepgemm's k_grouped_fp8_gemm_tn_contiguous (CPU reference path) and a stand-in DeepGEMM fed the re-laid expert
    blocks, both adding into `out` in place: the first call leaves addend + A_g B_g^T (the reference), the next adds
    the product again; the addend is as large as the product, so dropping C would fail the check."""
    import sys

    from deepgemm.bench import deepseek
    from deepgemm.bench.moe_peers import DEEPSEEK_MOE
    from deepgemm.bench.results import CALC_DIFF_TOLERANCE

    print(f"seed {SEED}")
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "deep_gemm", _deepgemm_stand_in(calls))
    deepseek.load.cache_clear()
    try:
        problem = make_moe_problem(K_GROUPED, device="cpu", seed=SEED)
        a_q, sfa = problem.a
        assert a_q.shape == (72, 512) and sfa.shape == (72, 4) and a_q.dtype == torch.float8_e4m3fn
        reference, product = problem.reference(), problem.product_reference()
        assert calc_diff(product, reference) > 100 * CALC_DIFF_TOLERANCE  # the addend matters
        assert calc_diff(problem.addend.double(), reference) > 100 * CALC_DIFF_TOLERANCE
        assert torch.equal(reference[2], problem.addend[2].double())  # the expert without tokens
        for impl in (DEEPGEMM_MOE, DEEPSEEK_MOE):
            prepared = impl.prepare(problem)
            assert prepared.select is None and prepared.bytes == K_GROUPED.hbm_bytes() and "C = out" in prepared.note
            first = prepared.fn().clone()
            assert calc_diff(first, reference) < 1e-4, impl.name
            assert calc_diff(prepared.fn(), reference + product) < 1e-4, impl.name
        assert calls[0] == ([128, 384, 0], [128, 384, 0], torch.int32, True, 1, 1)
    finally:
        deepseek.load.cache_clear()


def test_deepseek_v3_decode_suite_is_the_small_batches() -> None:
    """The decode suite: the DeepSeek-V3 (N, K) pairs at per-GPU decode batches below one 64-row block."""
    from deepgemm.bench.suites import DEEPSEEK_V3_NK, suite_names, suite_shapes

    shapes = suite_shapes("deepseek-v3-decode")
    assert "deepseek-v3-decode" in suite_names() and len(shapes) == 24 and len(set(shapes)) == 24
    assert {m for m, _, _ in shapes} == {1, 8, 16, 32}
    assert {(n, k) for _, n, k in shapes} == set(DEEPSEEK_V3_NK)
