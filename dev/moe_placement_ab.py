"""How much does where the tensors land move an MoE suite ratio? The FP8 MoE suite's cases (`deepgemm bench --suite
deepseek-v3-moe`, the same operands from the same seed) measured by the bench's own `measure_all` (each
implementation checked against float64, ours and DeepGEMM HEAD timed interleaved), once per placement: before the
operands are made, a spacer of OFFSET MiB is allocated and kept, so every tensor lands elsewhere in device memory;
the caching allocator is emptied between placements. The k-grouped 4 x ~8192, 4096 x 7168 case swung 0.90-1.04
(DeepGEMM / ours) between H100 machines on 2026-12-06: a ratio that moves with the placement as much within one
machine is the harness's, not the kernel's.

  python dev/moe_placement_ab.py [CASE-SUBSTRING ...] [--offsets 0,3,33,129] [--repeats 2]

Default cases: the three k-grouped 4096 x 7168 / contiguous N = 4096 cases whose ratios moved most across machines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

DEFAULT_CASES = ["k-grouped 4x~8192 M=4096 N=7168", "k-grouped 8x~4096 M=4096 N=7168",
                 "contiguous 8x~4096 N=4096 K=7168"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", default=DEFAULT_CASES, help="substrings of the suite's case labels")
    parser.add_argument("--offsets", default="0,3,33,129", help="spacer sizes in MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per placement")
    args = parser.parse_args()

    import torch

    from deepgemm.bench.moe_cases import deepseek_v3_moe
    from deepgemm.bench.moe_inputs import make_moe_problem
    from deepgemm.bench.moe_peers import moe_implementations
    from deepgemm.bench.runner import BenchSettings, measure_all, runnable

    settings = BenchSettings(precision="fp8", suite="deepseek-v3-moe")
    chosen, left_out = runnable(moe_implementations("fp8"))
    if left_out:
        print(f"left out: {left_out}", file=sys.stderr)
    cases = [case for case in deepseek_v3_moe(settings.seed) if any(text in case.label for text in args.cases)]
    if not cases:
        raise SystemExit(f"no suite case matches {args.cases}")
    names = [impl.name for impl in chosen]
    print(f"| case | spacer MiB | repeat | {' | '.join(f'{name} µs' for name in names)} | peer / ours | calc_diff |")
    print(f"|---|---|---|{'---|' * len(names)}---|---|")
    for case in cases:
        for offset in (int(v) for v in args.offsets.split(",")):
            torch.cuda.empty_cache()
            spacer = torch.empty(offset << 20, dtype=torch.uint8, device="cuda")
            problem = make_moe_problem(case, device="cuda", seed=settings.seed)
            for repeat in range(args.repeats):
                results = {m.impl: m for m in measure_all(chosen, problem, settings)}
                bad = [f"{name}: {m.status} {m.reason}" for name, m in results.items() if m.status != "ok"]
                if bad:
                    raise SystemExit(f"{case.label}: {'; '.join(bad)}")
                times = [results[name].median_us for name in names]
                ratio = f"{times[1] / times[0]:.3f}" if len(times) > 1 else "-"
                diffs = " / ".join(f"{results[name].calc_diff:.1e}" for name in names)
                print(f"| {case.label} | {offset} | {repeat} | {' | '.join(f'{t:.1f}' for t in times)} | {ratio} | "
                      f"{diffs} |", flush=True)
            del problem, spacer  # held until the case's timings at this placement are done


if __name__ == "__main__":
    main()
