"""Run every implementation on every shape on the GPU and collect :class:`BenchResults`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from deepgemm.analysis.gpus import Precision
from deepgemm.analysis.roofline import Ceilings
from deepgemm.bench.inputs import make_problem, reference_diff
from deepgemm.bench.moe_cases import MoeCase
from deepgemm.bench.moe_inputs import make_moe_problem
from deepgemm.bench.moe_peers import moe_implementations
from deepgemm.bench.peers import P, Implementation, Prepared, Unavailable, implementations_for
from deepgemm.bench.results import BenchResults, Measurement
from deepgemm.bench.suites import Shape, format_shape
from deepgemm.errors import UnsupportedError
from deepgemm.tuning.timing import FLUSH_BYTES, FlushMode, Timing, bench_gpu_interleaved

Progress = Callable[[Sequence[Shape], str, Callable[[Shape], str]], Iterator[Shape]]


@dataclass(frozen=True)
class BenchSettings:
    precision: Precision = "fp8"
    iters: int = 30
    warmup: int = 5
    flush_l2: bool = True
    flush_mode: FlushMode = "zero"  # how (deepgemm.tuning.timing.FLUSH_MODES)
    use_graph: bool = True
    seed: int = 0
    suite: str | None = None
    skip: tuple[str, ...] = ()  # implementations left out on request (never deepgemm's own)
    layout: str = "nt"  # the operands' stored forms (BF16 runs: nt, nn, tn or tt; FP8: nt)

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.precision, "layout": self.layout, "iters": self.iters, "warmup": self.warmup,
                "flush_l2_bytes": FLUSH_BYTES if self.flush_l2 else 0, "flush_mode": self.flush_mode,
                "use_graph": self.use_graph, "seed": self.seed, "suite": self.suite, "skip": list(self.skip)}


def cuda_device_problem() -> str | None:
    """None when a CUDA GPU is usable here, else a sentence saying why not."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        build = "a CPU-only PyTorch build" if torch.version.cuda is None else "no CUDA device visible"
        return f"no CUDA GPU ({build}, torch {torch.__version__})"
    return None


def package_version() -> str:
    try:
        return metadata.version("deepgemm")
    except metadata.PackageNotFoundError:
        return "unknown"


def environment() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"device": props.name, "num_sms": props.multi_processor_count,
            "compute_capability": f"{props.major}.{props.minor}", "torch": torch.__version__,
            "cuda": torch.version.cuda, "deepgemm": package_version()}


def run_bench(shapes: Sequence[Shape], settings: BenchSettings, ceilings: Ceilings, *,
              progress: Progress) -> BenchResults:
    chosen, left_out = runnable(implementations_for(settings.precision, settings.layout), settings.skip)
    return _run(shapes, lambda shape: make_problem(shape, settings.precision, device="cuda", seed=settings.seed),
                chosen, left_out, settings, ceilings, progress, lambda shape: "")


def run_moe_bench(cases: Sequence[MoeCase], settings: BenchSettings, ceilings: Ceilings, *,
                  progress: Progress) -> BenchResults:
    """An MoE suite: each case's grouped GEMM, ours, DeepGEMM's where installed and in BF16 torch._grouped_mm, stored
    under the case's shape (valid rows, N, K; k-grouped: M, N, tokens) with its label in each measurement's `case`."""
    if settings.layout != "nt":
        raise ValueError("argument --layout: the MoE suites time the NT grouped GEMMs (k-grouped: TN), no --layout")
    by_shape = {case.shape: case for case in cases}
    chosen, left_out = runnable(moe_implementations(settings.precision), settings.skip)
    return _run(list(by_shape), lambda shape: make_moe_problem(by_shape[shape], device="cuda", seed=settings.seed,
                                                               precision=settings.precision),
                chosen, left_out, settings, ceilings, progress, lambda shape: by_shape[shape].label)


def _run(shapes: Sequence[Shape], make: Callable[[Shape], P], chosen: Sequence[Implementation[P]],
         left_out: dict[str, str], settings: BenchSettings, ceilings: Ceilings, progress: Progress,
         case_of: Callable[[Shape], str]) -> BenchResults:
    """Every shape's problem made and measured (`case_of`: an MoE case's label, "" for a dense shape); a shape whose
    inputs cannot be made (e.g. out of memory) is an error for each implementation, and the run goes on."""
    import torch

    measurements: list[Measurement] = []
    for shape in progress(list(shapes), "benchmarking", lambda shape: case_of(shape) or format_shape(shape)):
        try:
            problem = make(shape)
        except Exception as exc:  # noqa: BLE001 - reported per shape, the run goes on
            reason = f"inputs could not be made: {type(exc).__name__}: {_first_line(exc)}"
            measurements.extend(Measurement(*shape, impl=impl.name, precision=impl.precision, status="error",
                                            reason=reason, case=case_of(shape)) for impl in chosen)
            torch.cuda.empty_cache()
            continue
        measurements.extend(measure_all(chosen, problem, settings))
        del problem
        torch.cuda.empty_cache()
    env = environment()
    if left_out:
        env["left_out"] = left_out
    return BenchResults(
        ceilings=ceilings, measurements=measurements, environment=env, settings=settings.to_json(),
        implementations={impl.name: impl.description for impl in chosen},
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def runnable(implementations: Sequence[Implementation[P]],
             skip: Sequence[str] = ()) -> tuple[tuple[Implementation[P], ...], dict[str, str]]:
    """(the implementations to run, {name: why left out}): peers named in `skip` and optional peers that cannot run
    here (not installed) are left out; deepgemm's own implementations always run."""
    kept: list[Implementation[P]] = []
    left_out: dict[str, str] = {}
    for impl in implementations:
        reason = "skipped on request" if impl.name in skip and not impl.is_deepgemm else (
            impl.missing() if impl.missing is not None else None)
        if reason is None:
            kept.append(impl)
        else:
            left_out[impl.name] = reason
    return tuple(kept), left_out


def measure_all(implementations: Sequence[Implementation[P]], problem: P, settings: BenchSettings) -> list[Measurement]:
    """Every implementation on one problem: a checked eager call each, then their timed graph replays.
    Implementations of the same operation (deepgemm, DeepGEMM where installed, and cuBLAS block-wise) are timed
    interleaved, round by round (``bench_gpu_interleaved``), so they run under the same clock; the others
    (per-tensor FP8 and BF16, which draw different power) are timed on their own. If an interleaved group fails,
    each member is timed alone to find the one that fails, and the others are timed interleaved again.

    A peer that refuses the shape (or raises) is "n/a"; deepgemm raising anything but
    UnsupportedError is an "error". Neither stops the run.
    """
    import torch

    results: list[Measurement | None] = []
    ready: list[tuple[int, Prepared, float]] = []  # (index in results, prepared, calc_diff)
    for impl in implementations:
        base = _identity(impl, problem)
        try:
            prepared = impl.prepare(problem)
        except (Unavailable, UnsupportedError) as exc:
            results.append(Measurement(**base, status="n/a", reason=str(exc)))
            continue
        except Exception as exc:  # noqa: BLE001 - a peer (or ours) failing to set up is reported, the run goes on
            status: Literal["n/a", "error"] = "error" if impl.is_deepgemm else "n/a"
            reason = f"setup failed: {type(exc).__name__}: {_first_line(exc)} ({format_shape(problem.shape)})"
            results.append(Measurement(**base, status=status, reason=reason))
            continue
        try:
            out = prepared.fn()
            torch.cuda.synchronize()
            diff = reference_diff(out if prepared.select is None else prepared.select(out), prepared.reference())
        except Exception as exc:  # noqa: BLE001 - reported per shape, the run goes on
            results.append(_failed(impl, base, problem, prepared, exc))
            continue
        ready.append((len(results), prepared, diff))
        results.append(None)

    def time_interleaved(fns: list[Callable[[], Any]]) -> list[Timing]:
        return bench_gpu_interleaved(fns, iters=settings.iters, warmup=settings.warmup, flush_l2=settings.flush_l2,
                                     use_graph=settings.use_graph, flush_mode=settings.flush_mode)

    timings: dict[int, Timing | BaseException] = {}
    alone: set[int] = set()  # same-operation implementations timed one by one after the interleaved timing failed
    for operation in dict.fromkeys(implementations[index].operation for index, _, _ in ready):
        group = [(index, prepared) for index, prepared, _ in ready if implementations[index].operation == operation]
        try:
            timings.update(zip((index for index, _ in group), time_interleaved([prepared.fn for _, prepared in group])))
        except Exception as exc:  # noqa: BLE001 - time them one by one to tell which one fails
            if len(group) == 1:
                timings[group[0][0]] = exc
                continue
            working = []
            for index, prepared in group:
                try:
                    timings[index] = time_interleaved([prepared.fn])[0]
                    working.append((index, prepared))
                except Exception as exc:  # noqa: BLE001
                    timings[index] = exc
            alone.update(index for index, _ in working)
            if 1 < len(working) < len(group):  # the rest, interleaved again without the failing ones
                try:
                    timings.update(zip((index for index, _ in working),
                                       time_interleaved([prepared.fn for _, prepared in working])))
                    alone.difference_update(index for index, _ in working)
                except Exception:  # noqa: BLE001 - keep their lone timings
                    pass
    for index, prepared, diff in ready:
        timing = timings[index]
        impl = implementations[index]
        if isinstance(timing, BaseException):
            results[index] = _failed(impl, _identity(impl, problem), problem, prepared, timing)
        else:
            results[index] = Measurement(
                **_identity(impl, problem), status="ok",
                median_us=timing.median_us, min_us=timing.min_us, p10_us=timing.p10_us, p90_us=timing.p90_us,
                samples=len(timing.samples_us), cuda_graph=timing.graph, calc_diff=diff, bytes=prepared.bytes,
                note="; ".join(filter(None, (prepared.note, "timed alone" if index in alone else ""))))
    return [result for result in results if result is not None]


def _identity(impl: Implementation[P], problem: P) -> dict[str, Any]:
    """The fields that name a measurement: shape, implementation and precision."""
    return {"m": problem.m, "n": problem.n, "k": problem.k, "impl": impl.name, "precision": impl.precision,
            "case": problem.label}


def _failed(impl: Implementation[P], base: dict[str, Any], problem: P, prepared: Prepared,
            exc: BaseException) -> Measurement:
    status: Literal["n/a", "error"] = "n/a" if isinstance(exc, UnsupportedError) or not impl.is_deepgemm else "error"
    reason = f"{type(exc).__name__}: {_first_line(exc)} ({format_shape(problem.shape)})"
    return Measurement(**base, status=status, reason=reason, bytes=prepared.bytes, note=prepared.note)


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:limit]
