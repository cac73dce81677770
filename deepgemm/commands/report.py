"""``deepgemm report``: tables, charts (roofline, speedups) and a Markdown summary of a results file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from deepgemm.bench.console import say, usage_error
from deepgemm.bench.report import ceilings_line, geomean_speedups, markdown_summary, print_results_table, problems
from deepgemm.bench.results import BenchResults, ResultsFormatError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report", help="summarise a bench results file: table, roofline and speedup charts, Markdown",
        description="Render a results file written by 'deepgemm bench --json'.")
    parser.add_argument("results", type=Path, help="results JSON (format: docs/cli.md)")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="write the roofline chart here")
    parser.add_argument("--speedup-plot", type=Path, metavar="PNG",
                        help="write the speedup bar chart here (default with --plot: <plot>-speedup.png)")
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="write a Markdown summary here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the charts and the Markdown first (a reader that stops early, as `| head` does, cannot lose them),
    then print the table and notes and where the files are."""
    try:
        results = BenchResults.load(args.results)
    except ResultsFormatError as exc:
        return usage_error("report", f"argument results: {exc}")
    charts: list[Path] = []
    notes: list[str] = []
    if args.plot or args.speedup_plot:
        try:
            charts, notes = _write_charts(results, args.plot, args.speedup_plot)
        except ImportError as exc:
            say(f"cannot draw charts: matplotlib is missing ({exc}); pip install 'deepgemm[bench]'")
            return 1
    if args.markdown:
        base = args.markdown.resolve().parent
        links = [os.path.relpath(path.resolve(), base) for path in charts]
        args.markdown.write_text(markdown_summary(results, plots=links), encoding="utf-8")
        notes.append(f"wrote {args.markdown}")

    say(ceilings_line(results.ceilings))
    print_results_table(f"{args.results}", results)
    for peer, (value, count) in geomean_speedups(results).items():
        say(f"deepgemm vs {peer}: {value:.2f}x geometric-mean speedup over {count} shapes")
    for issue in problems(results):
        say(issue)
    for note in notes:
        say(note)
    return 0


def _write_charts(results: BenchResults, roofline_path: Path | None,
                  speedup_path: Path | None) -> tuple[list[Path], list[str]]:
    """The charts written, and a line for each (or for one that could not be drawn)."""
    from deepgemm.bench.plots import roofline_figure, save, speedup_figure

    written: list[Path] = []
    notes: list[str] = []
    if roofline_path is not None:
        written.append(save(roofline_figure(results), roofline_path))
        notes.append(f"wrote {roofline_path}")
        if speedup_path is None:
            speedup_path = roofline_path.with_name(f"{roofline_path.stem}-speedup{roofline_path.suffix}")
    if speedup_path is not None:
        figure = speedup_figure(results)
        if figure is None:
            notes.append("no speedup chart: no shape has both a deepgemm measurement and a peer")
        else:
            written.append(save(figure, speedup_path))
            notes.append(f"wrote {speedup_path}")
    return written, notes
