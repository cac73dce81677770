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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from scripts.bench_grouped import contiguous_inputs, issue5_cases, masked_bytes, masked_inputs  # noqa: E402


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

    cases = [case for case in issue5_cases()[0] if args.only in case.label]
    if args.compile_only:
        for narrow in narrow_settings:
            os.environ["DEEPGEMM_NARROW_LAST_N"] = narrow  # read when a spec is made
            specs = {fp8_gemm.Fp8GemmSpec(c.n, c.k, torch.bfloat16, make_config(len(c.m_indices()), c.n, c.k, bm, bn, 132, 2,
                                                                                cluster_m=1), fp8_gemm.GemmKind.GROUPED_CONTIGUOUS)
                     for c in cases for bm, bn in tiles}
            for spec in specs:
                print(spec.label(), fp8_gemm.compile_spec(spec).resources)
        return

    import deepgemm
    from deepgemm.api.layout import to_mn_major_tma_aligned
    from deepgemm.bench.timing import bench_gpu_interleaved

    original = fp8_gemm.contiguous_tile
    print("| case | tile | µs | TFLOPS | calc_diff vs the first tile | DeepGEMM TFLOPS |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        groups, counts, n, k = case.groups, case.counts, case.n, case.k
        a, b, m_indices = contiguous_inputs(case)
        m_total = m_indices.numel()
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
                  f"{flops / timing.median_us / 1e6:.0f} | {deepgemm.calc_diff(out, outs[0]):.1e} | {case.theirs} |", flush=True)


def masked_ab(tiles: list[tuple[int, int]], only: str, compile_only: bool, scale_layouts: bool = False) -> None:
    """The masked cases with each tile swapped into `masked_tile` (the same counts bench_grouped draws)."""
    import deepgemm.kernels.fp8_gemm as fp8_gemm
    from deepgemm.api.grouped import clear_grouped_plans
    from deepgemm.configs.heuristics import make_config

    cases = [case for case in issue5_cases()[1] if only in case.label]
    if compile_only:
        for case in cases:
            for bm, bn in tiles:
                config = make_config(case.expected, case.n, case.k, bm, bn, 132, 2, cluster_m=1)
                spec = fp8_gemm.Fp8GemmSpec(case.n, case.k, torch.bfloat16, config, fp8_gemm.GemmKind.GROUPED_MASKED)
                print(spec.label(), fp8_gemm.compile_spec(spec).resources)
        return

    import deepgemm
    from deepgemm.api.grouped import _masked_sfa_layout
    from deepgemm.bench.timing import bench_gpu_interleaved

    original = fp8_gemm.masked_tile
    print("| case | tile | µs | GB/s | TFLOPS | calc_diff vs the first tile | DeepGEMM |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        groups, expected, max_m, counts, n, k = case.groups, case.expected, case.max_m, case.counts, case.n, case.k
        a, b, masked_m = masked_inputs(case)
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
        flops = 2 * sum(counts) * n * k
        nbytes = masked_bytes(case)
        first = torch.cat([outs[0][g, :c] for g, c in enumerate(counts)])
        for name, out, timing in zip(names, outs, timings):
            mine = torch.cat([out[g, :c] for g, c in enumerate(counts)])
            print(f"| {case.label} | {name} | {timing.median_us:.1f} | {nbytes / timing.median_us / 1e3:.0f} | "
                  f"{flops / timing.median_us / 1e6:.0f} | {deepgemm.calc_diff(mine, first):.1e} | {case.theirs} |", flush=True)
        clear_grouped_plans()


if __name__ == "__main__":
    main()
