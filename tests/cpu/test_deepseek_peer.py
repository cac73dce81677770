"""DeepGEMM as an optional benchmark peer, with stand-in ``deep_gemm`` modules (the real one needs a GPU)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
import torch

from deepgemm.bench import deepseek
from deepgemm.bench.inputs import make_problem
from deepgemm.bench.peers import DEEPSEEK_FP8, IMPLEMENTATIONS, Unavailable
from deepgemm.bench.runner import runnable
from deepgemm.utils import calc_diff


@pytest.fixture(autouse=True)
def fresh_import() -> Iterator[None]:
    deepseek.load.cache_clear()
    yield
    deepseek.load.cache_clear()


def install(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType | None) -> None:
    """``import deep_gemm`` then returns ``module``; None makes the import fail."""
    monkeypatch.setitem(sys.modules, "deep_gemm", module)  # type: ignore[arg-type]


def stand_in(*, transform_fails: bool = False) -> tuple[types.ModuleType, list[tuple]]:
    """A deep_gemm whose GEMM computes the dequantized product (reading the scales it was given) and whose
    scale conversion returns a marked copy, recording every call."""
    calls: list[tuple] = []
    module = types.ModuleType("deep_gemm")
    module.__version__ = "0.0-test"  # type: ignore[attr-defined]

    def transform_sf_into_required_layout(sf, mn, k, recipe, num_groups=None, is_sfa=None):  # noqa: ANN001, ANN202
        calls.append(("transform", tuple(sf.shape), mn, k, recipe, num_groups, is_sfa))
        if transform_fails:
            raise RuntimeError("layout not supported")
        converted = sf.clone()
        converted.converted = True  # type: ignore[attr-defined]
        return converted

    def fp8_gemm_nt(a, b, d):  # noqa: ANN001, ANN202
        (a_q, sfa), (b_q, sfb) = a, b
        calls.append(("gemm", getattr(sfa, "converted", False), getattr(sfb, "converted", False)))
        exact_a = a_q.double() * sfa.double().repeat_interleave(128, dim=1)[:, : a_q.shape[1]]
        sfb_rows = sfb.double().repeat_interleave(128, dim=0)[: b_q.shape[0]]
        exact_b = b_q.double() * sfb_rows.repeat_interleave(128, dim=1)[:, : b_q.shape[1]]
        d.copy_(exact_a @ exact_b.t())

    module.transform_sf_into_required_layout = transform_sf_into_required_layout  # type: ignore[attr-defined]
    module.fp8_gemm_nt = fp8_gemm_nt  # type: ignore[attr-defined]
    return module, calls


def test_not_installed_peer_is_left_out_of_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, None)
    assert DEEPSEEK_FP8 in IMPLEMENTATIONS["fp8"]
    reason = DEEPSEEK_FP8.missing() if DEEPSEEK_FP8.missing else None
    assert reason is not None and "not importable" in reason
    kept, left_out = runnable(IMPLEMENTATIONS["fp8"])
    names = [impl.name for impl in kept]
    assert "deepseek-deepgemm" not in names and names[0] == "deepgemm" and "cublas-blockwise" in names
    assert "not importable" in left_out["deepseek-deepgemm"]
    problem = make_problem((64, 256, 256), "fp8", device="cpu", seed=1)
    with pytest.raises(Unavailable, match="not importable"):
        DEEPSEEK_FP8.prepare(problem)


def test_installed_peer_gets_converted_scales_and_is_checked_against_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    module, calls = stand_in()
    install(monkeypatch, module)
    assert DEEPSEEK_FP8.missing is not None and DEEPSEEK_FP8.missing() is None
    assert "deepseek-deepgemm" in [impl.name for impl in runnable(IMPLEMENTATIONS["fp8"])[0]]
    assert runnable(IMPLEMENTATIONS["fp8"], skip=("deepseek-deepgemm",))[1] == {"deepseek-deepgemm": "skipped on request"}
    m, n, k = 72, 320, 384  # a partial last scale block along N
    problem = make_problem((m, n, k), "fp8", device="cpu", seed=3)
    prepared = DEEPSEEK_FP8.prepare(problem)
    # Both conversions happen while preparing, before anything is timed.
    assert calls == [("transform", (m, 3), m, k, deepseek.RECIPE, None, True),
                     ("transform", (3, 3), n, k, deepseek.RECIPE, None, False)]
    out = prepared.fn()
    assert calls[-1] == ("gemm", True, True)
    assert prepared.note == "deep_gemm 0.0-test"
    assert prepared.bytes == m * k + n * k + 2 * m * n + (m * 3 + 3 * 3) * 4
    assert calc_diff(out, prepared.reference()) < 1e-3
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)


def test_a_refused_conversion_leaves_the_per_call_conversion_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    module, calls = stand_in(transform_fails=True)
    install(monkeypatch, module)
    problem = make_problem((64, 128, 256), "fp8", device="cpu", seed=5)
    prepared = DEEPSEEK_FP8.prepare(problem)
    prepared.fn()
    assert calls[-1] == ("gemm", False, False)
    assert "converted by DeepGEMM on every call" in prepared.note and "layout not supported" in prepared.note


def test_contiguous_alignment_is_read_from_the_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = stand_in()
    install(monkeypatch, module)
    assert deepseek.m_alignment() is None  # does not say
    module.get_mk_alignment_for_contiguous_layout = lambda: 64  # type: ignore[attr-defined]
    assert deepseek.m_alignment() == 64
    module.get_mk_alignment_for_contiguous_layout = lambda: 1 // 0  # type: ignore[attr-defined]
    assert deepseek.m_alignment() is None  # a failing helper leaves the grouped peer out, no crash


def test_a_peer_without_the_gemm_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = stand_in()
    del module.fp8_gemm_nt  # type: ignore[attr-defined]
    install(monkeypatch, module)
    problem = make_problem((64, 128, 256), "fp8", device="cpu", seed=7)
    with pytest.raises(Unavailable, match="has no fp8_gemm_nt"):
        DEEPSEEK_FP8.prepare(problem)
