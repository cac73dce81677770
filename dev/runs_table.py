"""Issue 22's closing table from several `deepgemm bench` runs of one suite (gpu_check `repeat`: bench_<i>.json,
moe_<i>.json): per case our µs and the peer's in the first run, the peer / ours ratio in every run, cuBLAS block-wise
/ ours where it ran, the geomean per run, and the targets checked in each run (every case >= --floor, geomean >=
--geomean, the shapes of --at-least-one >= 1.00).

  python dev/runs_table.py OUT/bench_1.json OUT/bench_2.json OUT/bench_3.json [--peer deepseek-deepgemm]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

OURS = "deepgemm"


def load_run(path: Path) -> dict[str, dict]:
    """Our rows of one results file, by case label (the MoE case name, else MxNxK)."""
    results = json.loads(path.read_text())["results"]
    rows = {}
    for row in results:
        if row["impl"] == OURS and row["status"] == "ok":
            rows[row["case"] or f"{row['m']}x{row['n']}x{row['k']}"] = row
    return rows


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description="the per-run ratio table of several bench results files")
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--peer", default="deepseek-deepgemm")
    parser.add_argument("--floor", type=float, default=0.99)
    parser.add_argument("--geomean", type=float, default=1.05)
    parser.add_argument("--at-least-one", default="4096x7168x16384")
    args = parser.parse_args()
    runs = [load_run(path) for path in args.runs]
    cases = [case for case in runs[0] if all(case in run for run in runs)]
    names = [path.stem for path in args.runs]
    print(f"| case | ours µs ({names[0]}) | {args.peer} µs | " + " | ".join(f"{n}" for n in names)
          + " | cuBLAS block-wise / ours |")
    print("|---|---|---|" + "---|" * len(runs) + "---|")
    ratios: list[list[float]] = [[] for _ in runs]
    misses: list[list[str]] = [[] for _ in runs]
    for case in cases:
        first = runs[0][case]
        cells = []
        for i, run in enumerate(runs):
            ratio = run[case]["speedup"].get(args.peer)
            if ratio is None:
                cells.append("—")
                continue
            ratios[i].append(ratio)
            limit = 1.0 if case == args.at_least_one else args.floor
            if ratio < limit:
                misses[i].append(f"{case} {ratio:.3f}")
            cells.append(f"{ratio:.3f}")
        peer_us = first["median_us"] * first["speedup"][args.peer] if args.peer in first["speedup"] else None
        cublas = first["speedup"].get("cublas-blockwise")
        print(f"| {case} | {first['median_us']:.1f} | {'—' if peer_us is None else f'{peer_us:.1f}'} | "
              + " | ".join(cells) + f" | {'—' if cublas is None else f'{cublas:.2f}'} |")
    print()
    for name, values, missed in zip(names, ratios, misses):
        mean = geomean(values)
        verdict = "met" if mean >= args.geomean and not missed else "missed"
        print(f"{name}: geomean {mean:.3f} over {len(values)} cases (target {args.geomean}); "
              f"below the floor: {', '.join(missed) or 'none'} -> {verdict}")


if __name__ == "__main__":
    main()
