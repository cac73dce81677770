"""FP8 k-grouped (expert Wgrad) epilogue and tile builds A/B: register stores with C read at each tile's start (main's
build before the TMA epilogue), TMA stores with C read, and in-place TMA reduce-add with 32-column chunks (5 stages),
16-column chunks (6 stages) and 32-column chunks with each group's tiles in bands of 16 M-blocks; wider tiles
(128 x 144, 6 stages, and 128 x 160, 5 stages, rolled K loop; DeepGEMM HEAD's heuristic, re-derived from its
heuristics/sm90.hpp, picks 128 x 152 with 4 stages for these cases, DG_PRINT_CONFIGS=1 prints what it ran: a 128 x 128
tile's shared-memory traffic, 80 KB per 512 MMA clocks, caps it near 80% of the tensor rate, 128 x 160's near 89%),
and 128 x 160 in bands of 4, 8 and 32 M-blocks, against
DeepGEMM HEAD's k_grouped_fp8_gemm_nt_contiguous where importable; all on the
MoE suite's four FP8 k-grouped cases (deepgemm.bench.moe_cases), the same operands, C = out accumulated in place,
interleaved sample by sample (CUDA-graph replay, L2 flushed, median of 30). Each build's first call from the addend is
checked against float64 (calc_diff).

Usage: python3 dev/kgrouped_fp8_epilogue_ab.py [--only LABEL_SUBSTRING] [--builds NAME_SUBSTRING | NAME,NAME,...]
(after `. .peers/use_deepgemm.sh` for the peer)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from deepgemm.api.kgrouped import _offsets  # noqa: E402
from deepgemm.api.layout import tma_rows, to_mn_major_tma_aligned  # noqa: E402
from deepgemm.bench.moe_cases import deepseek_v3_moe  # noqa: E402
from deepgemm.bench.moe_inputs import make_moe_problem  # noqa: E402
from deepgemm.bench.moe_peers import DEEPSEEK_MOE  # noqa: E402
from deepgemm.bench.peers import Unavailable  # noqa: E402
from deepgemm.kernels.sm90_fp8_gemm_1d1d.plan import get_kgrouped_plan  # noqa: E402
from deepgemm.tuning.timing import bench_gpu_interleaved  # noqa: E402
from deepgemm.utils import calc_diff  # noqa: E402

# (name, store_n, in place, group_rows, block_n): store_n 0 = straight from registers.
BUILDS = [("registers, C read", 0, False, 1, 128), ("TMA 32, C read", 32, False, 1, 128),
          ("TMA 32, reduce-add", 32, True, 1, 128), ("TMA 16, reduce-add", 16, True, 1, 128),
          ("TMA 32, reduce-add, band 16", 32, True, 16, 128), ("128 x 144, TMA 16, reduce-add", 16, True, 1, 144),
          ("128 x 160, TMA 32, reduce-add", 32, True, 1, 160), ("128 x 160, TMA 32, reduce-add, band 16", 32, True, 16, 160),
          ("128 x 160, TMA 32, reduce-add, band 4", 32, True, 4, 160),
          ("128 x 160, TMA 32, reduce-add, band 8", 32, True, 8, 160),
          ("128 x 160, TMA 32, reduce-add, band 32", 32, True, 32, 160)]


def build_launch(problem: Any, store_n: int, in_place: bool, group_rows: int,
                 block_n: int) -> tuple[Callable[[], Any], Any, str]:
    """(launch, out, label): one build adding A_g B_g^T into its own out (from the addend), C = out."""
    (a_q, sfa), (b_q, sfb) = problem.a, problem.b
    m, n = a_q.shape[0], b_q.shape[0]
    plan = get_kgrouped_plan(a_q.device.index, m, n, in_place, store_n, group_rows, block_n)
    out = problem.output()
    args = (tma_rows(a_q), to_mn_major_tma_aligned(sfa), tma_rows(b_q), to_mn_major_tma_aligned(sfb),
            _offsets.get(a_q.device, tuple(problem.grouping)), len(problem.grouping), out)

    def launch() -> Any:
        plan.launch(*args, None if in_place else out)
        return out

    return launch, out, plan.spec.label()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="cases whose label contains this")
    parser.add_argument("--builds", default="",
                        help="builds whose name contains this, or with commas: exactly these names (the first one "
                             "is the base)")
    args = parser.parse_args()
    print("| case | build | µs | TFLOPS | / first build | calc_diff |")
    print("|---|---|---|---|---|---|")
    for case in [c for c in deepseek_v3_moe() if c.kind == "k-grouped" and args.only in c.label]:
        problem = make_moe_problem(case, device="cuda", seed=0)
        reference = problem.reference()
        rows: list[tuple[str, Callable[[], Any], float]] = []
        names = args.builds.split(",") if "," in args.builds else None
        chosen = [b for b in BUILDS if (b[0] in names if names else args.builds in b[0])]
        for name, store_n, in_place, group_rows, block_n in chosen:
            launch, out, label = build_launch(problem, store_n, in_place, group_rows, block_n)
            diff = calc_diff(launch().double(), reference)  # first call from the addend
            rows.append((f"{name} ({label.split(' bm')[1]})", launch, diff))
        try:
            peer = DEEPSEEK_MOE.prepare(problem)
            rows.append((f"DeepGEMM HEAD ({peer.note})", peer.fn, calc_diff(peer.fn().double(), reference)))
        except Unavailable as exc:
            print(f"DeepGEMM HEAD not timed: {exc}", file=sys.stderr)
        torch.cuda.synchronize()
        timings = bench_gpu_interleaved([fn for _, fn, _ in rows])
        base = timings[0].median_us
        for (name, _, diff), timing in zip(rows, timings):
            us = timing.median_us
            tflops = 2 * case.m * case.n * case.k / us / 1e6
            print(f"| {case.label} ({case.k} tokens) | {name} | {us:.1f} | {tflops:.0f} | {us / base:.3f} | {diff:.1e} |",
                  flush=True)
        del problem, rows
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
