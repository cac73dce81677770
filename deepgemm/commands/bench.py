"""``deepgemm bench``: deepgemm against cuBLAS on a suite of shapes; a regression gate with --compare.

Without a GPU it compiles the kernels the shapes would use and prints configs and roofline predictions.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from deepgemm.analysis.gpus import DEFAULT_GPU, GPUS, GpuSpec, get_gpu, match_device_name
from deepgemm.analysis.models import ModelConfigError
from deepgemm.analysis.presets import PRESETS, resolve_model
from deepgemm.analysis.roofline import Ceilings
from deepgemm.bench import block_report, offline_report
from deepgemm.bench.block_impls import SKIPPABLE
from deepgemm.bench.block_layers import DEFAULT_TOKENS, block_plan, parse_tokens
from deepgemm.bench.block_runner import BlockSettings, run_block_bench
from deepgemm.bench.ceilings import measure_ceilings
from deepgemm.bench.compare import Comparison, compare, gated_implementations
from deepgemm.bench.console import print_table, say, track, usage_error
from deepgemm.bench.offline import find_precompiler, plan_shapes
from deepgemm.bench.peers import ALL_IMPLEMENTATIONS, BF16_LAYOUTS
from deepgemm.bench.report import (
    ceilings_line,
    geomean_speedups,
    markdown_summary,
    print_results_table,
    problems,
    summary_line,
)
from deepgemm.bench.results import BenchResults, ResultsFormatError
from deepgemm.bench.results_dir import DEFAULT_RESULTS_ROOT, ResultPaths, result_paths
from deepgemm.bench.moe_cases import MOE_SUITES, is_moe_suite, moe_suite
from deepgemm.bench.moe_peers import moe_implementations
from deepgemm.bench.runner import BenchSettings, cuda_device_problem, run_bench, run_moe_bench
from deepgemm.bench.suites import Shape, format_shape, parse_shape, suite_names, suite_shapes
from deepgemm.tuning.timing import FLUSH_MODES

DEFAULT_SUITE = "deepseek-v3"
DTYPES = ("fp8", "bf16")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmark deepgemm against cuBLAS (compile + roofline predictions without a GPU)",
        description="Time deepgemm and its cuBLAS peers on a suite of GEMM shapes (CUDA-graph replay, L2 flushed "
                    "before every sample), or, with --compare, check the results against a stored baseline.")
    shapes = parser.add_mutually_exclusive_group()
    shapes.add_argument("--suite", help=f"named shape set: {', '.join(suite_names())} (default {DEFAULT_SUITE}); or MoE "
                                        f"grouped GEMM cases (contiguous, masked and k-grouped, FP8 or BF16): "
                                        f"{', '.join(MOE_SUITES)}")
    shapes.add_argument("--shape", type=parse_shape, action="append", metavar="M,N,K", help="a shape; repeatable")
    shapes.add_argument("--model", metavar="NAME|config.json",
                        help=f"time one transformer block's linear layers as PyTorch modules instead ({', '.join(PRESETS)}"
                             ", or a Hugging Face config.json)")
    parser.add_argument("--tokens", type=_token_counts, metavar="T,T,...",
                        help=f"with --model: token counts (default {','.join(map(str, DEFAULT_TOKENS))})")
    parser.add_argument("--dtype", choices=DTYPES,
                        help="operand precision (default fp8; with --compare, the baseline's)")
    parser.add_argument("--layout", choices=BF16_LAYOUTS,
                        help="with --dtype bf16: the operands' stored forms, bf16_gemm_<layout> against "
                             "torch.matmul and DeepGEMM in the same layout (default nt: A [M,K], B [N,K]; nn: B [K,N]; "
                             "tn: A [K,M]; tt; with --compare, the baseline's)")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="write the results here (format: docs/cli.md) instead of into the results folder")
    parser.add_argument("--markdown", type=Path, metavar="PATH",
                        help="write the Markdown summary here instead of into the results folder")
    parser.add_argument("--results-dir", type=Path, metavar="DIR",
                        help=f"folder for results.json and results.md (default: a new folder in "
                             f"./{DEFAULT_RESULTS_ROOT}/ named after the time and the run)")
    parser.add_argument("--iters", type=_positive_int, default=30, help="timed samples per implementation (30)")
    parser.add_argument("--warmup", type=_non_negative_int, default=5, help="untimed calls first (5)")
    parser.add_argument("--no-flush", dest="flush_l2", action="store_false", help="keep L2 warm between samples")
    parser.add_argument("--flush", dest="flush_mode", choices=FLUSH_MODES, default="zero",
                        help="how L2 is flushed before each sample: zero (write a 256 MiB buffer, the default and "
                             "DeepGEMM's method; the dirty lines it leaves are written back during the timed call) or "
                             "read (read it: clean lines, as a model's earlier weight reads leave them; decode-size "
                             "GEMMs time lower)")
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
    gate.add_argument("--relative-to", metavar="PEER",
                      help="compare each implementation's speed relative to PEER in the same run (PEER time / its "
                           "time) with the baseline's, instead of absolute times, which move between hosts")
    parser.set_defaults(func=run)


def _skippable() -> list[str]:
    impls = [*ALL_IMPLEMENTATIONS.values(), *moe_implementations("fp8"), *moe_implementations("bf16")]
    return list(dict.fromkeys(impl.name for impl in impls if not impl.is_deepgemm))


def run(args: argparse.Namespace) -> int:
    if args.model is not None or args.tokens is not None:
        return _run_model(args)
    try:
        baseline = BenchResults.load(args.compare) if args.compare else None
        current = BenchResults.load(args.results) if args.results else None
        _settle_operands(args, baseline)
    except ResultsFormatError as exc:
        return usage_error("bench", f"argument --compare/--results: {exc}")
    if args.layout != "nt" and args.dtype != "bf16":
        return usage_error("bench", f"argument --layout: {args.layout} needs --dtype bf16 (FP8 runs time fp8_gemm_nt)")
    try:
        shapes = _shapes(args, baseline)
        gpu = get_gpu(args.gpu) if args.gpu else None
    except ResultsFormatError as exc:
        return usage_error("bench", f"argument --compare/--results: {exc}")
    except ValueError as exc:
        return usage_error("bench", str(exc) if str(exc).startswith("argument") else f"argument --gpu: {exc}")
    if args.results and baseline is None:
        return usage_error("bench", "argument --results: needs --compare BASELINE.json")
    if args.relative_to and baseline is None:
        return usage_error("bench", "argument --relative-to: needs --compare BASELINE.json")

    try:
        if current is not None and baseline is not None:  # --results always comes with --compare
            return _report_comparison(compare(baseline, current, fail_below=args.fail_below, gate=args.gate,
                                              relative_to=args.relative_to))
        no_gpu = cuda_device_problem()
        moe = _moe_suite_name(args, baseline)
        if moe is not None and args.layout != "nt":
            return usage_error("bench", f"argument --layout: {moe} times the NT grouped GEMMs (k-grouped: TN), "
                                        "no --layout")
        if no_gpu is not None:
            if moe is not None:
                return usage_error("bench", f"argument --suite: {moe} needs a GPU ({no_gpu}); without one only "
                                            "dense suites print predictions")
            return _offline(args, shapes, gpu or get_gpu(DEFAULT_GPU), no_gpu)
        if baseline is not None:  # a bad --gate or --relative-to fails before the run, not after it
            gated_implementations(baseline, args.gate, args.relative_to)
        results = _measure(args, shapes, gpu, moe)
        status = _report(args, results)
        if baseline is not None:
            status = max(status, _report_comparison(compare(baseline, results, fail_below=args.fail_below,
                                                            gate=args.gate, relative_to=args.relative_to)))
        return status
    except ValueError as exc:
        return usage_error("bench", str(exc))


def _settle_operands(args: argparse.Namespace, baseline: BenchResults | None) -> None:
    """--dtype and --layout where given, else the baseline's (a comparison re-runs what it compares with), else fp8 nt.
    Raises ResultsFormatError for a baseline naming a dtype or layout this version does not run."""
    stored = baseline.settings if baseline is not None else {}
    for name, choices, default in (("dtype", DTYPES, "fp8"), ("layout", BF16_LAYOUTS, "nt")):
        if getattr(args, name) is None:
            value = stored.get(name, default)
            if value not in choices:
                raise ResultsFormatError(f"the baseline's settings.{name} {value!r} is not one of {', '.join(choices)}")
            setattr(args, name, value)


def _moe_suite_name(args: argparse.Namespace, baseline: BenchResults | None) -> str | None:
    """The MoE suite this run times: --suite, or (without --suite and --shape) the baseline's."""
    if args.shape:
        return None
    name = args.suite or (str(baseline.settings.get("suite") or "") if baseline is not None else "")
    return name.strip().lower() if name and is_moe_suite(name) else None


def _shapes(args: argparse.Namespace, baseline: BenchResults | None) -> list[Shape]:
    if args.shape:
        return list(dict.fromkeys(args.shape))
    moe = _moe_suite_name(args, baseline)
    if moe is not None:
        return [case.shape for case in moe_suite(moe, args.dtype)]
    if args.suite:
        return list(suite_shapes(args.suite))
    if baseline is not None:
        return baseline.shapes()
    return list(suite_shapes(DEFAULT_SUITE))


# -- with a GPU -------------------------------------------------------------------------------------------------

def _measure(args: argparse.Namespace, shapes: list[Shape], gpu: GpuSpec | None, moe: str | None) -> BenchResults:
    """Time the shapes, or the cases of the MoE suite `moe`."""
    import torch

    device = torch.cuda.get_device_name()
    spec = gpu or match_device_name(device) or get_gpu(DEFAULT_GPU)
    say(f"[bold]{device}[/bold]: {len(shapes)} shapes, dtype {_what(args)}, {args.iters} samples each")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        say(f"[yellow]{device} (sm_{major}{minor}) cannot run deepgemm's kernels (sm_90a, Hopper only): its rows "
            "will fail; the peers are timed[/yellow]")
    if gpu is not None and not gpu.runs_sm90a:
        say(f"note: --gpu {gpu.name} ({gpu.arch}) cannot run deepgemm's kernels; its datasheet is used for the "
            "percentages only")
    if args.datasheet:
        ceilings = Ceilings.from_spec(spec)
    else:
        say("measuring ceilings (device copy, 8192^3 matmuls)...")
        ceilings = measure_ceilings(device, spec)
    say(ceilings_line(ceilings))
    settings = BenchSettings(precision=args.dtype, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2,
                             flush_mode=args.flush_mode, use_graph=args.use_graph, seed=args.seed,
                             suite=moe or args.suite, skip=tuple(args.skip), layout=args.layout)
    if moe:
        return run_moe_bench(moe_suite(moe, args.dtype), settings, ceilings, progress=track)
    return run_bench(shapes, settings, ceilings, progress=track)


def _report(args: argparse.Namespace, results: BenchResults) -> int:
    """Write the results (JSON and Markdown), then print the table and notes, a summary line and where the results
    are; 1 if deepgemm failed or was inaccurate, 2 if the results could not be written."""
    paths = _result_paths(args, f"bench-{_run_name(args)}")
    written = _write_results(paths, [lambda: results.save(paths.json),
                                     lambda: _write_text(paths.markdown, markdown_summary(results))])
    print_results_table("results", results)
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
    say(f"[bold]{summary_line(results)}[/bold]")
    say(_results_line(paths, written))
    deepgemm_failed = any(m.impl.startswith("deepgemm") and (m.status == "error" or (m.ok and not m.accurate))
                          for m in results.measurements)
    return 1 if deepgemm_failed else 0 if written else 2


def _run_name(args: argparse.Namespace) -> str:
    """What the shapes were, for the results folder's name: the suite, "shapes" (--shape) or "compare"."""
    return args.suite or ("shapes" if args.shape else "compare" if args.compare else DEFAULT_SUITE)


def _result_paths(args: argparse.Namespace, name: str) -> ResultPaths:
    return result_paths(name, json=args.json, markdown=args.markdown, results_dir=args.results_dir)


def _write_results(paths: ResultPaths, writers: Sequence[Callable[[], None]]) -> bool:
    """Run the writers (before anything is printed, so that a reader that stops early cannot lose the files);
    False, with the reason on stderr, when a file cannot be written."""
    try:
        paths.prepare()
        for write in writers:
            write()
    except OSError as exc:
        print(f"deepgemm bench: error: cannot write the results: {exc}", file=sys.stderr, flush=True)
        return False
    return True


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _results_line(paths: ResultPaths, written: bool) -> str:
    return paths.describe() if written else "results: not written (the error is above)"


def _report_comparison(comparison: Comparison) -> int:
    def cell(value: float | None, unit: str = "", digits: int = 1) -> str:
        return f"{value:.{digits}f}{unit}" if value is not None else "-"

    peer = comparison.relative_to
    headers = ["shape", "implementation", "verdict", "speed vs baseline" if peer is None else "ratio vs baseline"]
    if peer is not None:  # the same-run ratios the row's ratio divides
        headers += ["rel. baseline", "rel. now"]
    headers += ["baseline us", "now us", "detail"]
    rows = [[format_shape(row.shape), row.impl, row.verdict, f"{row.ratio:.3f}x" if row.ratio is not None else "",
             *([cell(row.relative_baseline, "x", 3), cell(row.relative_current, "x", 3)] if peer else []),
             cell(row.baseline_us), cell(row.current_us), row.detail]
            for row in comparison.rows]
    us = (len(headers) - 3, len(headers) - 2)  # with a peer, absolute times give way first when the table is too wide
    print_table(f"regression check (fail below {comparison.fail_below:.2f}x of {comparison.measure})",
                headers, rows, left_columns=3, key_columns=2, fold=(len(headers) - 1,), drop=us if peer else (),
                caption=f"rel.: {peer} time / the implementation's, in the same results file" if peer else None)
    for note in comparison.notes:
        say(f"note: {note}")
    say(f"[bold]{comparison.verdict_line()}[/bold]")
    return comparison.exit_code


# -- --model: one transformer block (deepgemm.bench.block_*) ----------------------------------------------------

def _run_model(args: argparse.Namespace) -> int:
    if args.model is None:
        return usage_error("bench", "argument --tokens: needs --model NAME")
    others = [flag for flag, given in (("--compare", args.compare), ("--results", args.results),
                                       ("--relative-to", args.relative_to),
                                       ("--dtype bf16", args.dtype == "bf16"),
                                       (f"--layout {args.layout}", args.layout not in (None, "nt")))
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
        for flag in ("json", "markdown", "results_dir"):
            if getattr(args, flag):
                say(f"--{flag.replace('_', '-')}: not written: there are no measurements without a GPU")
        layers = sum(len(plan.layers) for plan in plans)
        say(f"[bold]summary: {model.name}: {layers} layers at {len(plans)} token counts listed; nothing timed "
            "without a GPU[/bold]")
        say("results: none written (nothing was measured)")
        return 0
    settings = BlockSettings(iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2, flush_mode=args.flush_mode,
                             use_graph=args.use_graph, seed=args.seed, skip=tuple(args.skip))
    results = run_block_bench(model, [plan.tokens for plan in plans], settings, progress=track, log=say)
    paths = _result_paths(args, f"bench-block-{model.name}")
    written = _write_results(paths, [lambda: results.save(paths.json),
                                     lambda: _write_text(paths.markdown, block_report.markdown(results))])
    block_report.print_results(results, plans)
    say(f"[bold]{block_report.summary_line(results)}[/bold]")
    say(_results_line(paths, written))
    return results.exit_code if results.exit_code or written else 2


# -- without a GPU ----------------------------------------------------------------------------------------------

def _offline(args: argparse.Namespace, shapes: list[Shape], gpu: GpuSpec, reason: str) -> int:
    """Compile each shape's kernel and predict its time; write the plan, print it, end with a summary line and where
    the plan is. 1 if deepgemm refused a shape or could not compile its kernel, as with a GPU."""
    try:  # (before anything is printed: a GPU without this precision's peak is bad input)
        Ceilings.from_spec(gpu).tflops(args.dtype)
    except ValueError as exc:
        return usage_error("bench", f"argument --gpu: {exc}")
    say(f"[bold]{reason}[/bold]: nothing can be timed here.")
    compile_kernels = (args.compile_kernels and gpu.runs_sm90a
                       and find_precompiler(args.dtype, args.layout)[0] is not None)
    if not gpu.runs_sm90a:
        say(f"[bold]{gpu.name} ({gpu.arch}) cannot run deepgemm's kernels (sm_90a, Hopper only)[/bold]: nothing is "
            "compiled for it; the table is its datasheet roofline only.")
    action = "compiling the kernels (NVRTC, sm_90a) each shape would use and " if compile_kernels else ""
    say(f"Instead: {action}predicting times from the {gpu.name} roofline (datasheet peaks).")
    plans, missing = plan_shapes(shapes, args.dtype, gpu, compile_kernels=args.compile_kernels and gpu.runs_sm90a,
                                 progress=track, layout=args.layout)
    if not gpu.runs_sm90a:
        missing = f"nothing compiled: {gpu.name} ({gpu.arch}) cannot run sm_90a kernels"
    paths = _result_paths(args, f"bench-plan-{_run_name(args)}")
    document = offline_report.plan_document(plans, args.dtype, gpu, missing)
    markdown = offline_report.plan_markdown(plans, args.dtype, gpu, missing)
    written = _write_results(paths, [lambda: offline_report.save_plan(paths.json, document),
                                     lambda: _write_text(paths.markdown, markdown)])
    if missing:
        say(missing)
    other = offline_report.OTHER_CONFIG
    print_table(f"{_what(args)} kernels and roofline predictions on {gpu.name} ({gpu.num_sms} SMs)",
                offline_report.HEADERS, offline_report.rows(plans), left_columns=(0, 1, other), fold=(other,),
                drop=(offline_report.TFLOPS,), caption=offline_report.LEGEND)
    if args.compare:
        say("--compare: nothing was measured without a GPU, so there is nothing to compare (--results CURRENT.json "
            "compares two stored files)")
    failed = [plan for plan in plans if plan.failed]
    for plan in failed:
        say(f"[yellow]{format_shape(plan.shape)}: {plan.error}[/yellow]")
    say(f"[bold]{offline_report.summary_line(plans, args.dtype, gpu)}[/bold]")
    say(_results_line(paths, written))
    return 1 if failed else 0 if written else 2


def _what(args: argparse.Namespace) -> str:
    """The operation a run times: "fp8", or "bf16 (nt)" with the layout."""
    return f"bf16 ({args.layout})" if args.dtype == "bf16" else args.dtype


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
