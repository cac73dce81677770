"""MoE grouped GEMMs (contiguous or masked) with other tiles than the cost model's (one device call).

For each issue-5 case (same token counts as scripts/bench_grouped.py), each tile's plan is built with a swapped-in
tile and the plans are timed interleaved (one sample of each per round; CUDA graph, L2 flushed, median of 30), each
output checked against the first tile's (masked: on the valid rows). Usage:
grouped_tile_ab.py [--compile-only] [--masked] [--only SUBSTRING] [--tiles 256x128,128x192,...] [--narrow-ab]
--narrow-ab (contiguous): each tile twice, with full-width last N-blocks (DEEPGEMM_NARROW_LAST_N=0) and narrow ones.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from scripts.bench_grouped import CONTIGUOUS, MASKED, counts_for  # noqa: E402

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--tiles", default="256x128,128x192,128x128")
    parser.add_argument("--masked", action="store_true", help="the masked cases (default: contiguous)")
    parser.add_argument("--only", default="", help="cases whose label contains this")
    parser.add_argument("--scale-layouts", action="store_true",
                        help="masked: time each tile with the scales as one M-major tensor and copied per group")
    parser.add_argument("--narrow-ab", action="store_true",
                        help="contiguous: each tile with full-width and with narrow last N-blocks")
    args = parser.parse_args()
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
    narrow_settings = ("0", "1") if args.narrow_ab else (os.environ.get("DEEPGEMM_NARROW_LAST_N", "1"),)
    if args.masked:
        masked_ab(tiles, args.only, args.compile_only, args.scale_layouts)
        return

    import deepgemm.kernels.fp8_gemm as fp8_gemm
    from deepgemm.api.grouped import clear_grouped_plans
    from deepgemm.configs.heuristics import make_config

    rng = random.Random(0)
    cases = []
    for groups, expected, n, k, theirs in CONTIGUOUS:
        counts = counts_for(groups, expected, rng)
        if args.only in f"contiguous {groups}x~{expected} N={n} K={k}":
            cases.append((groups, counts, n, k, theirs))
    if args.compile_only:
        specs = {fp8_gemm.Fp8GemmSpec(n, k, torch.bfloat16, make_config(sum(-(-c // 128) * 128 for c in counts), n, k, bm, bn,
                                                                      132, 2, cluster_m=1), fp8_gemm.GemmKind.GROUPED_CONTIGUOUS)
                 for _, counts, n, k, _ in cases for bm, bn in tiles}
        for narrow in narrow_settings:
            os.environ["DEEPGEMM_NARROW_LAST_N"] = narrow
            for spec in specs:
                res = fp8_gemm.compile_spec(spec).resources
                print(spec.label(), f"narrow={narrow}", res)
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
        launches, outs, names = [], [], []
        for (bm, bn), narrow in ((tile, narrow) for tile in tiles for narrow in narrow_settings):
            # Each tile's own plan (the plan cache is keyed by shape, so it is cleared around each build).
            fp8_gemm.contiguous_tile = lambda *_, tile=(bm, bn): tile
            os.environ["DEEPGEMM_NARROW_LAST_N"] = narrow
            names.append(f"{bm}x{bn}" + (f" narrow={narrow}" if args.narrow_ab else ""))
            clear_grouped_plans()
            plan = fp8_gemm.get_grouped_plan(0, fp8_gemm.GemmKind.GROUPED_CONTIGUOUS, fp8_gemm.Geometry(rows=m_total, groups=groups),
                                             n, k, torch.bfloat16, m_total)
            if (plan.spec.config.block_m, plan.spec.config.block_n) != (bm, bn):
                raise SystemExit(f"asked for {bm}x{bn}, the plan has {plan.spec.label()}")
            out = torch.full((m_total, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            plan.launch(a[0], sfa, b[0], sfb, out, m_indices)
            outs.append(out)
            launches.append(lambda plan=plan, out=out: plan.launch(a[0], sfa, b[0], sfb, out, m_indices))
        fp8_gemm.contiguous_tile = original
        clear_grouped_plans()
        torch.cuda.synchronize()
        timings = bench_gpu_interleaved(launches, iters=30, warmup=5)
        flops = 2 * sum(counts) * n * k
        for name, out, timing in zip(names, outs, timings):
            print(f"| contiguous {groups}x~{sum(counts) // groups} N={n} K={k} | {name} | {timing.median_us:.1f} | "
                  f"{flops / timing.median_us / 1e6:.0f} | {deepgemm.calc_diff(out, outs[0]):.1e} | {theirs} |", flush=True)


def masked_ab(tiles: list[tuple[int, int]], only: str, compile_only: bool, scale_layouts: bool = False) -> None:
    """The masked cases with each tile swapped into `masked_tile` (the same counts bench_grouped draws)."""
    import deepgemm.kernels.fp8_gemm as fp8_gemm
    from deepgemm.api.grouped import clear_grouped_plans
    from deepgemm.configs.heuristics import make_config

    rng = random.Random(0)
    for groups, expected, _, _, _ in CONTIGUOUS:
        counts_for(groups, expected, rng)  # keep the draw order of bench_grouped
    cases = []
    for groups, expected, max_m, n, k, theirs in MASKED:
        counts = counts_for(groups, expected, rng, cap=max_m)
        label = f"masked {groups}x~{expected} (max_m {max_m}) N={n} K={k}"
        if only in label:
            cases.append((label, groups, expected, max_m, counts, n, k, theirs))
    if compile_only:
        for _, groups, expected, _, _, n, k, _ in cases:
            for bm, bn in tiles:
                config = make_config(expected, n, k, bm, bn, 132, 2, cluster_m=1)
                spec = fp8_gemm.Fp8GemmSpec(n, k, torch.bfloat16, config, fp8_gemm.GemmKind.GROUPED_MASKED)
                print(spec.label(), fp8_gemm.compile_spec(spec).resources)
        return

    import deepgemm
    from deepgemm.api.grouped import _masked_sfa_layout
    from deepgemm.bench.timing import bench_gpu_interleaved
    from tests.helpers import random_activations, random_grouped_weights

    original = fp8_gemm.masked_tile
    print("| case | tile | µs | GB/s | TFLOPS | calc_diff vs the first tile | DeepGEMM |")
    print("|---|---|---|---|---|---|---|")
    for label, groups, expected, max_m, counts, n, k, theirs in cases:
        a2d = random_activations(groups * max_m, k, "cuda", 3)
        a = (a2d[0].view(groups, max_m, k), a2d[1].reshape(groups, max_m, -1))
        b = random_grouped_weights(groups, n, k, "cuda", 4)
        masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
        sfa, sfb = _masked_sfa_layout(a[1]), b[1].contiguous()
        layouts = {"": sfa}
        if scale_layouts:
            per_group = torch.empty(groups, a[1].shape[2], max_m, device="cuda")
            per_group.copy_(a[1].transpose(1, 2))
            layouts = {" one M-major": sfa, " per group": per_group.transpose(1, 2)}
        launches, outs, names = [], [], []
        for bm, bn in tiles:
            fp8_gemm.masked_tile = lambda *_, tile=(bm, bn): tile
            clear_grouped_plans()
            out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected)
            plan = next(iter(fp8_gemm._grouped_plans.values()))
            if (plan.spec.config.block_m, plan.spec.config.block_n) != (bm, bn):
                raise SystemExit(f"asked for {bm}x{bn}, the plan has {plan.spec.label()}")
            # The plan itself is timed (the API would look its plan up again, after the cache was cleared).
            for index, (layout, scales) in enumerate(layouts.items()):
                outs.append(out if index == 0 else out.clone())
                names.append(f"{bm}x{bn}{layout}")
                launches.append(lambda plan=plan, out=outs[-1], scales=scales: plan.launch(a[0], scales, b[0], sfb, out, masked_m))
                launches[-1]()
        fp8_gemm.masked_tile = original
        torch.cuda.synchronize()
        timings = bench_gpu_interleaved(launches, iters=30, warmup=5)
        valid = sum(counts)
        flops = 2 * valid * n * k
        nbytes = valid * k + groups * n * k + valid * n * 2
        first = torch.cat([outs[0][g, :c] for g, c in enumerate(counts)])
        for name, out, timing in zip(names, outs, timings):
            mine = torch.cat([out[g, :c] for g, c in enumerate(counts)])
            print(f"| {label} | {name} | {timing.median_us:.1f} | {nbytes / timing.median_us / 1e3:.0f} | "
                  f"{flops / timing.median_us / 1e6:.0f} | {deepgemm.calc_diff(mine, first):.1e} | {theirs} |", flush=True)
        clear_grouped_plans()


if __name__ == "__main__":
    main()
