"""measure_all on CPU with fake implementations: grouping by operation, interleaving, and failures."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from deepgemm.bench import runner
from deepgemm.bench.peers import Implementation, Prepared, Unavailable
from deepgemm.tuning.timing import Timing


class FakeProblem:
    m, n, k = 4, 8, 16
    shape = (4, 8, 16)
    label = ""


def _impl(name: str, operation: str, *, fails_eager: bool = False, fails_timing: bool = False,
          unavailable: bool = False, fails_setup: bool = False) -> Implementation:
    expected = torch.arange(32, dtype=torch.float64).reshape(4, 8) + 1

    def prepare(_: Any) -> Prepared:
        if unavailable:
            raise Unavailable(f"{name} refuses")
        if fails_setup:
            raise RuntimeError(f"{name} setup blew up\nsecond line")

        def fn() -> torch.Tensor:
            if fails_eager:
                raise RuntimeError(f"{name} broke")
            return expected.clone()

        fn.fails_timing = fails_timing  # type: ignore[attr-defined]
        return Prepared(fn, lambda: expected, bytes=100, note=f"{name} note" if name.startswith("peer") else "")

    return Implementation(name, name, "fp8", prepare, operation)


@pytest.fixture()
def timed(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake_interleaved(fns: list, **_: Any) -> list[Timing]:
        calls.append([getattr(fn, "__qualname__", "?") for fn in fns])
        if len(fns) > 1 and any(getattr(fn, "fails_timing", False) for fn in fns):
            raise RuntimeError("capture failed")
        if any(getattr(fn, "fails_timing", False) for fn in fns):
            raise RuntimeError("replay failed")
        return [Timing.from_samples([10.0 + i, 11.0 + i, 12.0 + i]) for i in range(len(fns))]

    monkeypatch.setattr(runner, "bench_gpu_interleaved", fake_interleaved)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return calls


def test_same_operation_is_interleaved_others_alone(timed: list[list[str]]) -> None:
    impls = [_impl("deepgemm", "fp8-blockwise"), _impl("peer-blockwise", "fp8-blockwise"), _impl("peer-bf16", "bf16")]
    results = runner.measure_all(impls, FakeProblem(), runner.BenchSettings(iters=3, warmup=0))  # type: ignore[arg-type]
    assert [len(call) for call in timed] == [2, 1]
    assert [r.impl for r in results] == ["deepgemm", "peer-blockwise", "peer-bf16"]
    assert all(r.status == "ok" and r.calc_diff == pytest.approx(0.0, abs=1e-12) for r in results)
    assert results[0].median_us == 11.0 and results[1].median_us == 12.0 and results[2].median_us == 11.0
    assert results[1].note == "peer-blockwise note"


def test_failures_are_reported_per_implementation(timed: list[list[str]]) -> None:
    impls = [_impl("deepgemm", "fp8-blockwise"), _impl("peer-blockwise", "fp8-blockwise", fails_timing=True),
             _impl("peer-tensor", "fp8-tensorwise", unavailable=True), _impl("peer-bf16", "bf16", fails_eager=True)]
    results = runner.measure_all(impls, FakeProblem(), runner.BenchSettings(iters=3, warmup=0))  # type: ignore[arg-type]
    by_name = {r.impl: r for r in results}
    assert list(by_name) == ["deepgemm", "peer-blockwise", "peer-tensor", "peer-bf16"]
    # The pair's interleaved timing failed: each was retried alone; the failing peer is n/a, deepgemm is
    # timed and says it was timed alone.
    assert by_name["deepgemm"].status == "ok" and by_name["deepgemm"].note == "timed alone"
    assert by_name["peer-blockwise"].status == "n/a" and "replay failed" in (by_name["peer-blockwise"].reason or "")
    assert by_name["peer-tensor"].status == "n/a" and by_name["peer-tensor"].reason == "peer-tensor refuses"
    assert by_name["peer-bf16"].status == "n/a" and "peer-bf16 broke" in (by_name["peer-bf16"].reason or "")
    assert [len(call) for call in timed] == [2, 1, 1]


def test_deepgemm_failing_is_an_error(timed: list[list[str]]) -> None:
    results = runner.measure_all([_impl("deepgemm", "fp8-blockwise", fails_eager=True)], FakeProblem(),  # type: ignore[arg-type]
                                 runner.BenchSettings(iters=3, warmup=0))
    assert results[0].status == "error" and "deepgemm broke" in (results[0].reason or "")
    assert timed == []


def test_a_failing_peer_leaves_the_others_interleaved(timed: list[list[str]]) -> None:
    """Three implementations of one operation, one failing in timing: after the lone retries the two that work are
    timed interleaved again, so neither carries the 'timed alone' note."""
    impls = [_impl("deepgemm", "fp8-blockwise"), _impl("peer-broken", "fp8-blockwise", fails_timing=True),
             _impl("peer-blockwise", "fp8-blockwise")]
    results = runner.measure_all(impls, FakeProblem(), runner.BenchSettings(iters=3, warmup=0))  # type: ignore[arg-type]
    by_name = {r.impl: r for r in results}
    assert [len(call) for call in timed] == [3, 1, 1, 1, 2]
    assert by_name["deepgemm"].status == "ok" and "timed alone" not in by_name["deepgemm"].note
    assert by_name["peer-blockwise"].status == "ok" and "timed alone" not in by_name["peer-blockwise"].note
    assert by_name["peer-broken"].status == "n/a" and "replay failed" in (by_name["peer-broken"].reason or "")


def test_runnable_leaves_out_skipped_and_missing_peers_with_reasons() -> None:
    present = _impl("peer-blockwise", "fp8-blockwise")
    absent = Implementation("peer-absent", "peer-absent", "fp8", present.prepare, "fp8-blockwise",
                            missing=lambda: "not installed here")
    impls = [_impl("deepgemm", "fp8-blockwise"), present, absent, _impl("peer-bf16", "bf16")]
    kept, left_out = runner.runnable(impls, skip=("peer-bf16", "deepgemm"))
    assert [impl.name for impl in kept] == ["deepgemm", "peer-blockwise"]  # deepgemm itself is never skipped
    assert left_out == {"peer-absent": "not installed here", "peer-bf16": "skipped on request"}


def test_a_setup_failure_is_reported_and_the_others_still_run(timed: list[list[str]]) -> None:
    """An implementation whose preparation raises something unexpected (a peer's layout helper, out of memory) is
    n/a (a peer) or an error (ours), with the reason's first line; the others are measured as usual."""
    impls = [_impl("deepgemm", "fp8-blockwise"), _impl("peer-blockwise", "fp8-blockwise", fails_setup=True),
             _impl("deepgemm-bf16", "bf16", fails_setup=True)]
    results = runner.measure_all(impls, FakeProblem(), runner.BenchSettings(iters=3, warmup=0))  # type: ignore[arg-type]
    by_name = {r.impl: r for r in results}
    assert by_name["deepgemm"].status == "ok" and [len(call) for call in timed] == [1]
    assert by_name["peer-blockwise"].status == "n/a"
    assert by_name["peer-blockwise"].reason == "setup failed: RuntimeError: peer-blockwise setup blew up (4x8x16)"
    assert by_name["deepgemm-bf16"].status == "error" and "setup blew up" in (by_name["deepgemm-bf16"].reason or "")


def test_a_shape_whose_inputs_cannot_be_made_is_an_error_and_the_run_goes_on(timed: list[list[str]],
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(runner, "environment", lambda: {"device": "fake"})
    impls = (_impl("deepgemm", "fp8-blockwise"), _impl("peer-blockwise", "fp8-blockwise"))

    def make(shape: tuple[int, int, int]) -> FakeProblem:
        if shape == (1, 2, 3):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 30.00 GiB")
        return FakeProblem()

    def progress(shapes: list, description: str, label: Any) -> list:
        return shapes

    results = runner._run([(1, 2, 3), (4, 8, 16)], make, impls, {}, runner.BenchSettings(iters=3, warmup=0), None,  # type: ignore[arg-type]
                          progress, lambda shape: "masked 2x~8 N=2 K=3" if shape == (1, 2, 3) else "")
    first = [m for m in results.measurements if m.shape == (1, 2, 3)]
    assert [(m.impl, m.status, m.case) for m in first] == [("deepgemm", "error", "masked 2x~8 N=2 K=3"),
                                                          ("peer-blockwise", "error", "masked 2x~8 N=2 K=3")]
    assert first[0].reason == "inputs could not be made: OutOfMemoryError: CUDA out of memory. Tried to allocate 30.00 GiB"
    assert [m.status for m in results.measurements if m.shape == (4, 8, 16)] == ["ok", "ok"]


def test_chunked_diff_sums_match_the_whole_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    from deepgemm import utils

    seed = 20261206
    print("seed", seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(37, 53, generator=generator, dtype=torch.float64)
    y = (x + 1e-3 * torch.randn(37, 53, generator=generator, dtype=torch.float64)).bfloat16()
    x64, y64 = x, y.double()
    whole = float(1 - 2 * (x64 * y64).sum() / (x64 * x64 + y64 * y64).sum())
    monkeypatch.setattr(utils, "DIFF_CHUNK_ELEMENTS", 97)  # 21 chunks, the last one ragged
    assert utils.calc_diff(x, y) == pytest.approx(whole, rel=1e-9, abs=1e-15) and whole > 1e-8
    assert utils.calc_diff(x.t(), y.t()) == pytest.approx(whole, rel=1e-9, abs=1e-15)  # non-contiguous views
    assert utils.calc_diff(torch.zeros(5, 3), torch.zeros(5, 3)) == 0.0
    poisoned = y.clone()
    poisoned[36, 52] = float("nan")
    assert utils.calc_diff(x, poisoned) != utils.calc_diff(x, poisoned)  # NaN in the last chunk stays NaN
    with pytest.raises(ValueError, match="calc_diff: 'x' has shape"):
        utils.calc_diff(x, y[:, :5])


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_a_large_reference_is_checked_by_row_blocks(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from deepgemm.bench import inputs

    m, n, k = 200, 48, 256
    kept = inputs.make_problem((m, n, k), precision, device="cpu", seed=5)
    out = kept.reference().bfloat16()  # an output with real rounding error against the reference
    out[3, 7] += 0.5  # and one wrong element
    expected = inputs.reference_diff(out, kept.reference())
    assert isinstance(kept.reference(), torch.Tensor) and expected > 1e-8
    unscaled = kept.unscaled_reference() if precision == "fp8" else None
    monkeypatch.setattr(inputs, "REFERENCE_KEEP_BYTES", 8 * m * n - 1)  # too large to keep
    monkeypatch.setattr(inputs, "REFERENCE_BLOCK_BYTES", 8 * n * 33)  # blocks of 33 rows, the last of 2
    lazy = inputs.make_problem((m, n, k), precision, device="cpu", seed=5)
    reference = lazy.reference()
    assert isinstance(reference, inputs.RowBlockProduct) and reference.shape == (m, n)
    assert [first for first, _ in reference.blocks()] == list(range(0, m, 33))
    assert inputs.reference_diff(out, reference) == pytest.approx(expected, rel=1e-9)
    if unscaled is not None:
        assert isinstance(lazy.unscaled_reference(), inputs.RowBlockProduct)
        assert inputs.reference_diff(unscaled.bfloat16(), lazy.unscaled_reference()) == pytest.approx(
            inputs.reference_diff(unscaled.bfloat16(), unscaled), rel=1e-9)
    with pytest.raises(ValueError, match="reference_diff: the output has shape"):
        inputs.reference_diff(out[:-1], reference)


def test_measure_all_checks_outputs_against_a_row_block_reference(timed: list[list[str]]) -> None:
    from deepgemm.bench.inputs import RowBlockProduct

    a = torch.arange(12, dtype=torch.float64).reshape(4, 3)
    b = torch.ones(8, 3, dtype=torch.float64)
    exact = a @ b.t()

    def prepare(_: Any) -> Prepared:
        wrong = exact.clone()
        wrong[2, 5] = -wrong[2, 5]
        return Prepared(lambda: wrong, lambda: RowBlockProduct(a, b), bytes=100)

    rows = runner.measure_all([Implementation("deepgemm", "deepgemm", "fp8", prepare, "op")], FakeProblem(),
                              runner.BenchSettings())
    sums = (exact * exact).sum()
    assert rows[0].status == "ok"
    assert rows[0].calc_diff == pytest.approx(float(1 - 2 * (sums - 2 * exact[2, 5] ** 2) / (2 * sums)), rel=1e-12)
