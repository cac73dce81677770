"""``deepgemm shapes``: every GEMM of a model step, its FLOPs and bytes, and its roofline time on a GPU."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from deepgemm.analysis.gemms import CATEGORIES, Workload, assumptions, enumerate_gemms, step_shape
from deepgemm.analysis.gpus import DEFAULT_GPU, GPUS, GpuSpec, get_gpu
from deepgemm.analysis.models import ModelConfigError, ModelSpec
from deepgemm.analysis.ops import GemmOp
from deepgemm.analysis.presets import PRESETS, resolve_model
from deepgemm.analysis.roofline import Ceilings
from deepgemm.analysis.summary import PhaseSummary, summaries_to_dict, summarize
from deepgemm.analysis.units import micros, percent, si
from deepgemm.bench.console import print_table, say, usage_error

DEFAULT_SEQ = 4096


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "shapes", help="list a model's GEMMs with FLOPs, bytes and roofline time",
        description="Every GEMM of a transformer forward (prefill and/or one decode step), or of a training step "
                    "with --train, on one tensor-parallel rank, with its roofline time on a GPU.")
    parser.add_argument("--model", required=True, metavar="NAME|config.json",
                        help=f"a preset ({', '.join(PRESETS)}) or a local Hugging Face config.json / model folder")
    parser.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    parser.add_argument("--seq", type=int, default=None,
                        help=f"prompt tokens per sequence; also the KV-cache length of a decode step "
                             f"(default {DEFAULT_SEQ}). Given explicitly, the prefill is listed even with "
                             "--decode-tokens")
    parser.add_argument("--decode-tokens", type=int, default=0, metavar="T",
                        help="new tokens per sequence in one decode step (1 = ordinary decoding)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks; GEMMs are listed for one rank")
    parser.add_argument("--train", action="store_true", help="a training step: forward, dgrad and wgrad")
    parser.add_argument("--dtype", choices=("fp8", "bf16"), default="fp8", help="linear-layer precision")
    parser.add_argument("--gpu", default=DEFAULT_GPU, help=f"GPU spec for the roofline ({', '.join(GPUS)})")
    parser.add_argument("--no-fuse", dest="fused", action="store_false",
                        help="list Q/K/V and gate/up as separate GEMMs")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the analysis as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        model = resolve_model(args.model)
        gpu = get_gpu(args.gpu)
        seq = DEFAULT_SEQ if args.seq is None else args.seq
        workload = Workload(batch=args.batch, seq=seq, decode_tokens=args.decode_tokens,
                            include_prefill=args.seq is not None or args.decode_tokens == 0, tp=args.tp,
                            train=args.train, precision=args.dtype, fused=args.fused)
        ceilings = Ceilings.from_spec(gpu)
        ceilings.tflops(workload.precision)
        summaries = summarize(enumerate_gemms(model, workload), ceilings)
    except ModelConfigError as exc:
        return usage_error("shapes", f"argument --model: {exc}")
    except ValueError as exc:
        message = str(exc)
        return usage_error("shapes", message if message.startswith("argument") else f"argument --gpu/--dtype: {message}")

    if args.json:  # before printing, so that a reader that stops early (| head) cannot lose it
        try:
            _write_json(args.json, model, workload, gpu, summaries)
        except OSError as exc:
            return usage_error("shapes", f"argument --json: cannot write {args.json}: {exc}")
    _print_header(model, workload, gpu)
    for summary in summaries:
        _print_phase(summary, workload)
    _print_totals(summaries)
    if args.json:
        say(f"wrote {args.json}")
    return 0


def _print_header(model: ModelSpec, workload: Workload, gpu: GpuSpec) -> None:
    say(f"[bold]{model.name}[/bold]: {model.describe()}")
    fp8 = f"fp8 {gpu.fp8_tflops:,.0f} TFLOPS, " if gpu.fp8_tflops else ""
    say(f"roofline on {gpu.name} (datasheet, dense): {fp8}bf16 {gpu.bf16_tflops:,.0f} TFLOPS, "
        f"HBM {gpu.hbm_gbs / 1000:.2f} TB/s")
    if not gpu.runs_sm90a:
        say(f"note: {gpu.name} ({gpu.arch}) cannot run deepgemm's kernels (sm_90a, Hopper only): this is the "
            "model's roofline on it, not deepgemm's")
    say("assumptions:")
    for note in assumptions(model, workload):
        say(f"  - {note}")
    say()


def _phase_title(summary: PhaseSummary, workload: Workload) -> str:
    step = step_shape(summary.phase, workload)
    if summary.phase == "decode":
        return (f"decode step: M = {step.tokens} tokens ({_plural(step.sequences, 'sequence')} x {step.q_len} new), "
                f"attending to {step.kv_len} positions")
    what = "training step (forward + backward)" if summary.phase == "train" else "prefill"
    return f"{what}: M = {step.tokens} tokens ({_plural(step.sequences, 'sequence')} x {step.q_len})"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _m_cell(op: GemmOp) -> str:
    if op.kind == "grouped" and op.pass_ != "wgrad":
        per_group = op.m_per_group
        per_group_text = f"{per_group:.0f}" if per_group.is_integer() else f"{per_group:.2f}"
        return f"{op.m} = {op.groups}x{per_group_text}"
    return str(op.m)


def _intensity(flop_per_byte: float) -> str:
    """FLOP/B: whole numbers from 10 up, two significant digits below (0.25 printed as 0)."""
    return f"{flop_per_byte:,.0f}" if flop_per_byte >= 10 else f"{flop_per_byte:.2g}"


def _print_phase(summary: PhaseSummary, workload: Workload) -> None:
    headers = ["GEMM", "M", "N", "K", "batch", "count", "FLOPs", "bytes", "FLOP/B", "roofline us", "bound", "share"]
    rows = [
        [e.op.label, _m_cell(e.op), str(e.op.n), str(e.op.k), str(e.op.batch), str(e.op.count),
         si(e.op.flops), si(e.op.bytes, "B"), _intensity(e.op.intensity), micros(e.time_s), e.per_call.bound,
         percent(summary.share(e))]
        for e in summary.estimates
    ]
    caption = (f"total {si(summary.flops, 'FLOP')}, {si(summary.bytes, 'B')}, roofline {micros(summary.time_s)} us; "
               f"{percent(summary.memory_bound_time_s / summary.time_s if summary.time_s else 0)} of it in "
               "memory-bound GEMMs")
    print_table(_phase_title(summary, workload), headers, rows, caption=caption)
    by_category = summary.time_by_category()
    flops_by_category = {c: sum(e.op.flops for e in summary.estimates if e.op.category == c) for c in by_category}
    print_table(f"{summary.phase}: where the time goes", ["category", "FLOPs", "roofline us", "share"],
                [[c, si(flops_by_category[c]), micros(by_category[c]), percent(by_category[c] / summary.time_s)]
                 for c in CATEGORIES if c in by_category])
    say()


def _print_totals(summaries: list[PhaseSummary]) -> None:
    if len(summaries) < 2:
        return
    total = sum(s.time_s for s in summaries)
    parts = ", ".join(f"{s.phase} {micros(s.time_s)} us ({percent(s.time_s / total)})" for s in summaries)
    say(f"[bold]roofline time by phase[/bold]: {parts}")


def _write_json(path: Path, model: ModelSpec, workload: Workload, gpu: GpuSpec,
                summaries: list[PhaseSummary]) -> None:
    document = {
        "format": "deepgemm-shapes", "version": 1, "model": model.name, "gpu": gpu.key,
        "workload": {"batch": workload.batch, "seq": workload.seq, "decode_tokens": workload.decode_tokens,
                     "tp": workload.tp, "train": workload.train, "dtype": workload.precision,
                     "fused": workload.fused},
        "assumptions": assumptions(model, workload),
        "phases": summaries_to_dict(summaries),
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
