"""``deepgemm bench``: deepgemm against cuBLAS on a suite of shapes; a regression gate with --compare.

Without a GPU it compiles the kernels the shapes would use and prints configs and roofline predictions.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from deepgemm.analysis.gpus import DEFAULT_GPU, GPUS, GpuSpec, get_gpu, match_device_name
from deepgemm.analysis.models import ModelConfigError
from deepgemm.analysis.presets import PRESETS, resolve_model
from deepgemm.analysis.roofline import Ceilings
from deepgemm.analysis.units import micros
from deepgemm.bench import block_report
from deepgemm.bench.block_impls import SKIPPABLE
from deepgemm.bench.block_layers import DEFAULT_TOKENS, block_plan, parse_tokens
from deepgemm.bench.block_runner import BlockSettings, run_block_bench
from deepgemm.bench.ceilings import measure_ceilings
from deepgemm.bench.compare import Comparison, compare
from deepgemm.bench.console import print_table, say, track, usage_error
from deepgemm.bench.offline import OfflinePlan, plan_shapes
from deepgemm.bench.peers import ALL_IMPLEMENTATIONS
from deepgemm.bench.report import HEADERS, ceilings_line, geomean_speedups, markdown_summary, problems, result_rows
from deepgemm.bench.results import BenchResults, ResultsFormatError
from deepgemm.bench.runner import BenchSettings, cuda_device_problem, run_bench
from deepgemm.bench.suites import Shape, format_shape, parse_shape, suite_names, suite_shapes

DEFAULT_SUITE = "deepseek-v3"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmark deepgemm against cuBLAS (compile + roofline predictions without a GPU)",
        description="Time deepgemm and its cuBLAS peers on a suite of GEMM shapes (CUDA-graph replay, L2 flushed "
                    "before every sample), or, with --compare, check the results against a stored baseline.")
    shapes = parser.add_mutually_exclusive_group()
    shapes.add_argument("--suite", help=f"named shape set: {', '.join(suite_names())} (default {DEFAULT_SUITE})")
    shapes.add_argument("--shape", type=parse_shape, action="append", metavar="M,N,K", help="a shape; repeatable")
    shapes.add_argument("--model", metavar="NAME|config.json",
                        help=f"time one transformer block's linear layers as PyTorch modules instead ({', '.join(PRESETS)}"
                             ", or a Hugging Face config.json)")
    parser.add_argument("--tokens", type=_token_counts, metavar="T,T,...",
                        help=f"with --model: token counts (default {','.join(map(str, DEFAULT_TOKENS))})")
    parser.add_argument("--dtype", choices=("fp8", "bf16"), default="fp8", help="operand precision (default fp8)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results (format: docs/cli.md)")
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="write a Markdown summary")
    parser.add_argument("--iters", type=_positive_int, default=30, help="timed samples per implementation (30)")
    parser.add_argument("--warmup", type=_non_negative_int, default=5, help="untimed calls first (5)")
    parser.add_argument("--no-flush", dest="flush_l2", action="store_false", help="keep L2 warm between samples")
    parser.add_argument("--no-graph", dest="use_graph", action="store_false", help="launch eagerly, no CUDA graph")
    parser.add_argument("--datasheet", action="store_true",
                        help="percentages against the --gpu datasheet peaks instead of measured ceilings")
    parser.add_argument("--gpu", help=f"GPU spec for datasheet peaks and predictions ({', '.join(GPUS)}); "
                                      f"default: the detected GPU, else {DEFAULT_GPU}")
    parser.add_argument("--no-compile", dest="compile_kernels", action="store_false",
                        help="without a GPU: print roofline predictions only, compile nothing")
    parser.add_argument("--seed", type=int, default=0, help="random inputs' seed")
    parser.add_argument("--skip", action="append", default=[], metavar="IMPL", choices=_skippable(),
                        help=f"leave a peer out of the run; repeatable ({', '.join(_skippable())})")
    gate = parser.add_argument_group("regression check")
    gate.add_argument("--compare", type=Path, metavar="BASELINE.json", help="compare against a stored results file")
    gate.add_argument("--fail-below", type=_ratio, default=0.95, metavar="RATIO",
                      help="fail when a shape runs below RATIO x the baseline's speed (default 0.95)")
    gate.add_argument("--gate", action="append", metavar="IMPL",
                      help="implementation(s) whose speed is checked (default: the baseline's deepgemm ones)")
    gate.add_argument("--results", type=Path, metavar="CURRENT.json",
                      help="compare this stored results file instead of running the benchmark")
    parser.set_defaults(func=run)


def _skippable() -> list[str]:
    return [name for name, impl in ALL_IMPLEMENTATIONS.items() if not impl.is_deepgemm]


def run(args: argparse.Namespace) -> int:
    if args.model is not None or args.tokens is not None:
        return _run_model(args)
    try:
        baseline = BenchResults.load(args.compare) if args.compare else None
        current = BenchResults.load(args.results) if args.results else None
        shapes = _shapes(args, baseline)
        gpu = get_gpu(args.gpu) if args.gpu else None
    except ResultsFormatError as exc:
        return usage_error("bench", f"argument --compare/--results: {exc}")
    except ValueError as exc:
        return usage_error("bench", str(exc) if str(exc).startswith("argument") else f"argument --gpu: {exc}")
    if args.results and baseline is None:
        return usage_error("bench", "argument --results: needs --compare BASELINE.json")

    try:
        if current is not None and baseline is not None:  # --results always comes with --compare
            return _report_comparison(compare(baseline, current, fail_below=args.fail_below, gate=args.gate))
        no_gpu = cuda_device_problem()
        if no_gpu is not None:
            return _offline(args, shapes, gpu or get_gpu(DEFAULT_GPU), no_gpu)
        results = _measure(args, shapes, gpu)
        status = _report(args, results)
        if baseline is not None:
            status = max(status, _report_comparison(compare(baseline, results, fail_below=args.fail_below,
                                                            gate=args.gate)))
        return status
    except ValueError as exc:
        return usage_error("bench", str(exc))


def _shapes(args: argparse.Namespace, baseline: BenchResults | None) -> list[Shape]:
    if args.shape:
        return list(dict.fromkeys(args.shape))
    if args.suite:
        return list(suite_shapes(args.suite))
    if baseline is not None:
        return baseline.shapes()
    return list(suite_shapes(DEFAULT_SUITE))


# -- with a GPU -------------------------------------------------------------------------------------------------

def _measure(args: argparse.Namespace, shapes: list[Shape], gpu: GpuSpec | None) -> BenchResults:
    import torch

    device = torch.cuda.get_device_name()
    spec = gpu or match_device_name(device) or get_gpu(DEFAULT_GPU)
    say(f"[bold]{device}[/bold]: {len(shapes)} shapes, dtype {args.dtype}, {args.iters} samples each")
    if args.datasheet:
        ceilings = Ceilings.from_spec(spec)
    else:
        say("measuring ceilings (device copy, 8192^3 matmuls)...")
        ceilings = measure_ceilings(device, spec)
    say(ceilings_line(ceilings))
    settings = BenchSettings(precision=args.dtype, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2,
                             use_graph=args.use_graph, seed=args.seed, suite=args.suite, skip=tuple(args.skip))
    return run_bench(shapes, settings, ceilings, progress=track)


def _report(args: argparse.Namespace, results: BenchResults) -> int:
    """Print the table and notes, write the requested files; 1 if deepgemm failed or was inaccurate."""
    print_table("results", HEADERS, result_rows(results), left_columns=2)
    for peer, (value, count) in geomean_speedups(results).items():
        say(f"deepgemm vs {peer}: {value:.2f}x geometric-mean speedup over {count} shapes")
    for impl, reason in (results.environment.get("left_out") or {}).items():
        say(f"left out: {impl}: {reason}")
    notes = {m.impl: m.note for m in results.measurements if m.note}
    for impl, note in notes.items():
        say(f"note: {impl}: {note}")
    issues = problems(results)
    for issue in issues:
        say(f"[yellow]{issue}[/yellow]")
    if args.json:
        results.save(args.json)
        say(f"wrote {args.json}")
    if args.markdown:
        args.markdown.write_text(markdown_summary(results), encoding="utf-8")
        say(f"wrote {args.markdown}")
    deepgemm_failed = any(m.impl.startswith("deepgemm") and (m.status == "error" or (m.ok and not m.accurate))
                          for m in results.measurements)
    return 1 if deepgemm_failed else 0


def _report_comparison(comparison: Comparison) -> int:
    rows = [[format_shape(row.shape), row.impl, row.verdict,
             f"{row.ratio:.3f}x" if row.ratio is not None else "",
             f"{row.baseline_us:.1f}" if row.baseline_us is not None else "-",
             f"{row.current_us:.1f}" if row.current_us is not None else "-", row.detail]
            for row in comparison.rows]
    print_table(f"regression check (fail below {comparison.fail_below:.2f}x of baseline speed)",
                ["shape", "implementation", "verdict", "speed vs baseline", "baseline us", "now us", "detail"],
                rows, left_columns=3)
    for note in comparison.notes:
        say(f"note: {note}")
    say(f"[bold]{comparison.verdict_line()}[/bold]")
    return comparison.exit_code


# -- --model: one transformer block (deepgemm.bench.block_*) ----------------------------------------------------

def _run_model(args: argparse.Namespace) -> int:
    if args.model is None:
        return usage_error("bench", "argument --tokens: needs --model NAME")
    others = [flag for flag, given in (("--compare", args.compare), ("--results", args.results),
                                       ("--markdown", args.markdown), ("--dtype bf16", args.dtype == "bf16"))
              if given]
    if others:
        return usage_error("bench", f"argument --model: not with {', '.join(others)}")
    unknown = [name for name in args.skip if name not in SKIPPABLE]
    if unknown:
        return usage_error("bench", f"argument --skip: with --model only {', '.join(SKIPPABLE)}, got {unknown[0]}")
    try:
        model = resolve_model(args.model)
        plans = [block_plan(model, count) for count in args.tokens or DEFAULT_TOKENS]
    except ModelConfigError as exc:
        return usage_error("bench", f"argument --model: {exc}")
    except ValueError as exc:
        return usage_error("bench", str(exc) if str(exc).startswith("argument") else f"argument --model: {exc}")
    no_gpu = cuda_device_problem()
    if no_gpu is not None:
        block_report.print_plan(plans, no_gpu)
        if args.json:
            say("--json: not written: there are no measurements without a GPU")
        return 0
    settings = BlockSettings(iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2,
                             use_graph=args.use_graph, seed=args.seed, skip=tuple(args.skip))
    results = run_block_bench(model, [plan.tokens for plan in plans], settings, progress=track, log=say)
    block_report.print_results(results, plans)
    if args.json:
        results.save(args.json)
        say(f"wrote {args.json}")
    return results.exit_code


# -- without a GPU ----------------------------------------------------------------------------------------------

def _offline(args: argparse.Namespace, shapes: list[Shape], gpu: GpuSpec, reason: str) -> int:
    say(f"[bold]{reason}[/bold]: nothing can be timed here.")
    action = "compiling the kernels (NVRTC, sm_90a) each shape would use and " if args.compile_kernels else ""
    say(f"Instead: {action}predicting times from the {gpu.name} roofline (datasheet peaks).")
    try:
        Ceilings.from_spec(gpu).tflops(args.dtype)
    except ValueError as exc:
        return usage_error("bench", f"argument --gpu: {exc}")
    plans, missing = plan_shapes(shapes, args.dtype, gpu, compile_kernels=args.compile_kernels, progress=track)
    if missing:
        say(missing)
    headers = ["shape (MxNxK)", "tile MxNxK", "stages", "math WGs", "other config", "registers", "spills st/ld",
               "compile s", "roofline us", "TFLOPS at roof", "bound"]
    print_table(f"{args.dtype} kernels and roofline predictions on {gpu.name} ({gpu.num_sms} SMs)", headers,
                [_offline_row(plan) for plan in plans], left_columns=(0, 1, 4) if missing else (0, 4))
    if args.compare:
        say("--compare: nothing was measured without a GPU, so there is nothing to compare (--results CURRENT.json "
            "compares two stored files)")
    for flag in ("json", "markdown"):
        if getattr(args, flag):
            say(f"--{flag}: not written: there are no measurements without a GPU")
    return 0


def _offline_row(plan: OfflinePlan) -> list[str]:
    prediction = plan.prediction
    return [format_shape(plan.shape), *plan.config_cells(), micros(prediction.time_s),
            f"{plan.flops / prediction.time_s / 1e12:,.0f}", prediction.bound]


# -- argument types ---------------------------------------------------------------------------------------------

def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _token_counts(text: str) -> tuple[int, ...]:
    try:
        return parse_tokens(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value
