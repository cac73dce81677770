"""Contiguous MoE grouped GEMM with other tiles than the cost model's (one device call).

For each issue-5 contiguous case (same token counts as scripts/bench_grouped.py), each tile's plan is built with
a swapped-in tile and the plans are timed interleaved (one sample of each per round; CUDA graph, L2 flushed,
median of 30), each output checked against the first tile's. Usage: grouped_tile_ab.py [--compile-only] [--tiles 256x128,128x192,...]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from scripts.bench_grouped import CONTIGUOUS, counts_for  # noqa: E402

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--tiles", default="256x128,128x192,128x128")
    args = parser.parse_args()
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]

    import deepgemm.kernels.fp8_gemm as fp8_gemm
    from deepgemm.configs.heuristics import make_config

    rng = random.Random(0)
    cases = []
    for groups, expected, n, k, theirs in CONTIGUOUS:
        counts = counts_for(groups, expected, rng)
        cases.append((groups, counts, n, k, theirs))
    if args.compile_only:
        specs = {fp8_gemm.Fp8GemmSpec(n, k, torch.bfloat16, make_config(sum(-(-c // 128) * 128 for c in counts), n, k, bm, bn,
                                                                      132, 2, cluster_m=1), fp8_gemm.GemmKind.GROUPED_CONTIGUOUS)
                 for _, counts, n, k, _ in cases for bm, bn in tiles}
        for spec in specs:
            res = fp8_gemm.compile_spec(spec).resources
            print(spec.label(), res)
        return

    import deepgemm
    from deepgemm.api.layout import to_mn_major_tma_aligned
    from deepgemm.bench.timing import bench_gpu_interleaved
    from tests.helpers import random_activations, random_grouped_weights

    original = fp8_gemm.contiguous_tile
    print("| case | tile | µs | TFLOPS | calc_diff vs the first tile | DeepGEMM TFLOPS |")
    print("|---|---|---|---|---|---|")
    for groups, counts, n, k, theirs in cases:
        indices = sum(([g] * c + [-1] * (-(-c // 128) * 128 - c) for g, c in enumerate(counts)), [])
        m_total = len(indices)
        m_indices = torch.tensor(indices, dtype=torch.int32, device="cuda")
        a = random_activations(m_total, k, "cuda", 1)
        b = random_grouped_weights(groups, n, k, "cuda", 2)
        sfa, sfb = to_mn_major_tma_aligned(a[1]), b[1].contiguous()
        launches, outs = [], []
        for bm, bn in tiles:
            # Each tile's own plan (the plan cache is keyed by shape, so it is cleared around each build).
            fp8_gemm.contiguous_tile = lambda *_, tile=(bm, bn): tile
            fp8_gemm._grouped_plans.clear()
            plan = fp8_gemm.get_grouped_plan(0, fp8_gemm.GemmKind.GROUPED_CONTIGUOUS, fp8_gemm.Geometry(rows=m_total, groups=groups),
                                             n, k, torch.bfloat16, m_total)
            if (plan.spec.config.block_m, plan.spec.config.block_n) != (bm, bn):
                raise SystemExit(f"asked for {bm}x{bn}, the plan has {plan.spec.label()}")
            out = torch.full((m_total, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            plan.launch(a[0], sfa, b[0], sfb, out, m_indices)
            outs.append(out)
            launches.append(lambda plan=plan, out=out: plan.launch(a[0], sfa, b[0], sfb, out, m_indices))
        fp8_gemm.contiguous_tile = original
        fp8_gemm._grouped_plans.clear()
        torch.cuda.synchronize()
        timings = bench_gpu_interleaved(launches, iters=30, warmup=5)
        flops = 2 * sum(counts) * n * k
        for (bm, bn), out, timing in zip(tiles, outs, timings):
            print(f"| contiguous {groups}x~{sum(counts) // groups} N={n} K={k} | {bm}x{bn} | {timing.median_us:.1f} | "
                  f"{flops / timing.median_us / 1e6:.0f} | {deepgemm.calc_diff(out, outs[0]):.1e} | {theirs} |", flush=True)


if __name__ == "__main__":
    main()
