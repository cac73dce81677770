"""MoE grouped GEMMs (contiguous or masked) with other tiles than the cost model's (one device call).

For each issue-5 case (same token counts as dev/bench_grouped.py), each tile's plan is built from an explicit config
(`get_grouped_plan(..., config=...)`) and the plans are timed interleaved (one sample of each per round; CUDA graph, L2
flushed, median of 30), each output checked against the first tile's (masked: on the valid rows). Usage:
python dev/grouped_tile_ab.py [--compile-only] [--masked] [--only SUBSTRING] [--tiles 256x128,128x192,...] [--narrow-ab]
--narrow-ab (contiguous): each tile twice, with full-width last N-blocks (`GemmConfig.narrow_last_n=False`) and narrow ones.
DeepGEMM HEAD runs interleaved where it imports (both layouts).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from dev.bench_grouped import _peer_launch, contiguous_inputs, issue5_cases, masked_bytes, masked_inputs  # noqa: E402
from deepgemm.bench import deepseek  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--tiles", default="256x128,128x192,128x128")
    parser.add_argument("--masked", action="store_true", help="the masked cases (default: contiguous)")
    parser.add_argument("--only", default="", help="cases whose label contains this")
    parser.add_argument("--scale-layouts", action="store_true",
                        help="masked: time each tile with the scales as one M-major tensor and copied per group")
    parser.add_argument("--rows-scale", type=lambda text: [float(v) for v in text.split(",")], default=[1.0],
                        help="multiply every expert's drawn token count (masked: capped at max_m), e.g. 1.22; "
                             "masked: several, comma-separated, each a row of every case")
    parser.add_argument("--narrow-ab", action="store_true",
                        help="contiguous: each tile with full-width and with narrow last N-blocks")
    parser.add_argument("--dense-twin", action="store_true", help="each tile also as a dense GEMM of as many rows")
    parser.add_argument("--profile", action="store_true", help="run every launch twice instead of timing (ncu)")
    args = parser.parse_args()
    tiles = [parse_tile(t) for t in args.tiles.split(",")]
    narrow_settings = (False, True) if args.narrow_ab else (True,)
    if args.masked:
        masked_ab(tiles, args.only, args.compile_only, args.scale_layouts, args.rows_scale, args.dense_twin,
                  args.profile)
        return

    from deepgemm.api.grouped import clear_grouped_plans
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Geometry, get_grouped_plan
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    cases = [case for case in issue5_cases(args.rows_scale[0])[0] if args.only in case.label]
    if args.compile_only:
        specs = {Fp8GemmSpec(c.n, c.k, torch.bfloat16,
                             accumulators(contiguous_config(len(c.m_indices()), c.n, c.k, bm, bn, narrow), single),
                             GemmKind.GROUPED_CONTIGUOUS)
                 for c in cases for bm, bn, single in tiles for narrow in narrow_settings}
        for spec in specs:
            print(spec.label(), compile_spec(spec).resources)
        return

    import deepgemm
    from deepgemm.api.layout import to_mn_major_tma_aligned
    from deepgemm.tuning.timing import bench_gpu_interleaved

    with_peer = deepseek.missing() is None and 128 % (deepseek.m_alignment() or 256) == 0
    print("| case | tile | µs | TFLOPS | calc_diff vs the first tile (valid rows) | DeepGEMM (issue 5) |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        groups, counts, n, k = case.groups, case.counts, case.n, case.k
        a, b, m_indices = contiguous_inputs(case)
        m_total = m_indices.numel()
        sfa, sfb = to_mn_major_tma_aligned(a[1]), b[1].contiguous()
        launches, outs, names = [], [], []
        for (bm, bn, single), narrow in ((tile, narrow) for tile in tiles for narrow in narrow_settings):
            names.append(tile_name(bm, bn, single) + (f" narrow={int(narrow)}" if args.narrow_ab else ""))
            config = accumulators(contiguous_config(m_total, n, k, bm, bn, narrow), single)
            plan = get_grouped_plan(0, GemmKind.GROUPED_CONTIGUOUS, Geometry(rows=m_total, groups=groups), n, k, torch.bfloat16,
                                    m_total, config=config)
            if (plan.spec.config.block_m, plan.spec.config.block_n) != (bm, bn):
                raise SystemExit(f"asked for {bm}x{bn}, the plan has {plan.spec.label()}")
            out = torch.full((m_total, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            plan.launch(a[0], sfa, b[0], sfb, out, m_indices)
            outs.append(out)
            launches.append(lambda plan=plan, out=out: plan.launch(a[0], sfa, b[0], sfb, out, m_indices))
        if with_peer:  # DeepGEMM HEAD on the same inputs, interleaved with the tiles
            _add_peer(_peer_launch("m_grouped_fp8_gemm_nt_contiguous", a, b, outs[0], m_total, k, groups, m_indices),
                      launches, outs, names)
        clear_grouped_plans()
        label = f"contiguous {groups}x~{sum(counts) // groups} N={n} K={k}"
        twins = _dense_twins(m_total, n, k, tiles) if args.dense_twin else []
        if args.profile:
            _profile(label, names + [name for name, _ in twins], launches + [launch for _, launch in twins])
            continue
        torch.cuda.synchronize()
        timings = bench_gpu_interleaved(launches + [launch for _, launch in twins], iters=30, warmup=5)
        flops = 2 * sum(counts) * n * k
        valid = m_indices >= 0
        for name, out, timing in zip(names, outs, timings):
            diff = deepgemm.calc_diff(out[valid], outs[0][valid])
            print(f"| {label} | {name} | {timing.median_us:.1f} | "
                  f"{flops / timing.median_us / 1e6:.0f} | {diff:.1e} | {case.theirs} |", flush=True)
        _print_twins(label, twins, timings[len(names):], 2 * m_total * n * k)


def _dense_twins(m: int, n: int, k: int, tiles: list[tuple[int, int, bool]]) -> list:
    """(name, launch) of a dense m x n x k GEMM on each tile (the dense config's defaults), on random operands."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan
    from tests.helpers import random_operands

    a, b = random_operands(m, n, k, "cuda", seed=5)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    twins = []
    for bm, bn, single in tiles:
        plan = get_plan(0, m, n, k, torch.bfloat16, config=accumulators(make_config(m, n, k, bm, bn, 132, 2), single))
        twins.append((f"dense {m}x{n}x{k} {plan.spec.label()}",
                      lambda plan=plan: plan.launch(a[0], a[1], b[0], b[1], out)))
    if deepseek.missing() is None:  # DeepGEMM HEAD's dense GEMM of the same rows, on the same operands
        peer, why_not = _peer_launch("fp8_gemm_nt", a, b, out, m, k, None)
        if peer is None:
            print(f"(DeepGEMM dense twin not run: {why_not})")
        else:
            peer[0]()
            twins.append((f"dense {m}x{n}x{k} DeepGEMM HEAD", peer[0]))
    return twins


def _print_twins(label: str, twins: list, timings: list, flops: int) -> None:
    for (name, _), timing in zip(twins, timings):
        print(f"| {label} | {name} | {timing.median_us:.1f} | {flops / timing.median_us / 1e6:.0f} | - | - |", flush=True)


def _profile(label: str, names: list[str], launches: list) -> None:
    """Every launch twice, synchronized, in order (ncu numbers its kernels in this order)."""
    for name, launch in zip(names, launches):
        for _ in range(2):
            launch()
        torch.cuda.synchronize()
        print(f"profiled: {label} | {name} (2 launches)", flush=True)


def _add_peer(peer_and_reason, launches: list, outs: list, names: list) -> None:  # noqa: ANN001 - _peer_launch's result
    """Append DeepGEMM HEAD's launch (run once) and output to the interleaved set, or say why it is not run."""
    peer, why_not = peer_and_reason
    if peer is None:
        print(f"(DeepGEMM not run: {why_not})")
        return
    launches.append(peer[0])
    outs.append(peer[1])
    names.append("DeepGEMM HEAD")
    launches[-1]()


def parse_tile(text: str) -> tuple[int, int, bool]:
    """"BMxBN" (the config's accumulator rule) or "BMxBNu" (one accumulator: GemmConfig.pipelined=False)."""
    single = text.endswith("u")
    bm, bn = (int(v) for v in text.removesuffix("u").split("x"))
    return bm, bn, single


def tile_name(bm: int, bn: int, single: bool) -> str:
    return f"{bm}x{bn}" + (" one accumulator" if single else "")


def accumulators(config, single: bool):  # noqa: ANN001, ANN201 - a GemmConfig
    return replace(config, pipelined=False) if single else config


def contiguous_config(m_total: int, n: int, k: int, block_m: int, block_n: int, narrow_last_n: bool):  # noqa: ANN201
    """The config `get_grouped_plan` would build for a contiguous layout, with this tile and narrow-last-N setting."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config

    config = make_config(max(m_total, 1), n, k, block_m, block_n, 132, 2, cluster_m=1)
    return replace(config, narrow_last_n=narrow_last_n)


def masked_ab(tiles: list[tuple[int, int, bool]], only: str, compile_only: bool, scale_layouts: bool = False,
              rows_scales: tuple[float, ...] | list[float] = (1.0,), dense_twin: bool = False,
              profile: bool = False) -> None:
    """The masked cases with each tile's config passed to `get_grouped_plan` (the same counts bench_grouped draws)."""
    from deepgemm.api.grouped import clear_grouped_plans
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import masked_config_m
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Geometry, get_grouped_plan
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    def config_for(case, bm: int, bn: int, single: bool):  # noqa: ANN001, ANN202 - as get_grouped_plan sizes it
        config = make_config(max(masked_config_m(case.expected, case.max_m), 1), case.n, case.k, bm, bn, 132, 2, cluster_m=1)
        return accumulators(config, single)

    cases = [case for scale in rows_scales for case in issue5_cases(scale)[1] if only in case.label]
    if compile_only:
        for case in cases:
            for bm, bn, single in tiles:
                spec = Fp8GemmSpec(case.n, case.k, torch.bfloat16, config_for(case, bm, bn, single), GemmKind.GROUPED_MASKED)
                print(spec.label(), compile_spec(spec).resources)
        return

    import deepgemm
    from deepgemm.api.grouped import _masked_sfa_layout
    from deepgemm.tuning.timing import bench_gpu_interleaved

    with_peer = deepseek.missing() is None

    print("| case | tile | µs | GB/s | TFLOPS | calc_diff vs the first tile | DeepGEMM (issue 5) |")
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
        for bm, bn, single in tiles:
            out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            geometry = Geometry(rows=groups * max_m, groups=groups, max_m=max_m, tiles_known=False)
            plan = get_grouped_plan(0, GemmKind.GROUPED_MASKED, geometry, n, k, torch.bfloat16,
                                    masked_config_m(expected, max_m), config=config_for(case, bm, bn, single))
            if (plan.spec.config.block_m, plan.spec.config.block_n) != (bm, bn):
                raise SystemExit(f"asked for {bm}x{bn}, the plan has {plan.spec.label()}")
            # The plan itself is timed, with the scales in the layout the API passes.
            for index, (layout, scales) in enumerate(layouts.items()):
                outs.append(out if index == 0 else out.clone())
                names.append(f"{tile_name(bm, bn, single)}{layout}")
                launches.append(lambda plan=plan, out=outs[-1], scales=scales: plan.launch(a[0], scales, b[0], sfb, out, masked_m))
                launches[-1]()
        if with_peer:  # DeepGEMM HEAD on the same inputs, interleaved with the tiles
            _add_peer(_peer_launch("m_grouped_fp8_gemm_nt_masked", a, b, outs[0], max_m, k, groups, masked_m, expected),
                      launches, outs, names)
        twins = _dense_twins(sum(counts), n, k, tiles) if dense_twin else []
        if profile:
            _profile(case.label, names + [name for name, _ in twins], launches + [launch for _, launch in twins])
            clear_grouped_plans()
            continue
        torch.cuda.synchronize()
        timings = bench_gpu_interleaved(launches + [launch for _, launch in twins], iters=30, warmup=5)
        flops = 2 * sum(counts) * n * k
        nbytes = masked_bytes(case)
        first = torch.cat([outs[0][g, :c] for g, c in enumerate(counts)])
        for name, out, timing in zip(names, outs, timings):
            mine = torch.cat([out[g, :c] for g, c in enumerate(counts)])
            print(f"| {case.label} rows {'+'.join(map(str, counts))} | {name} | {timing.median_us:.1f} | "
                  f"{nbytes / timing.median_us / 1e3:.0f} | "
                  f"{flops / timing.median_us / 1e6:.0f} | {deepgemm.calc_diff(mine, first):.1e} | {case.theirs} |", flush=True)
        for (name, _), timing in zip(twins, timings[len(names):]):
            print(f"| {case.label} rows {'+'.join(map(str, counts))} | {name} | {timing.median_us:.1f} | - | "
                  f"{flops / timing.median_us / 1e6:.0f} | - | - |",
                  flush=True)
        clear_grouped_plans()


if __name__ == "__main__":
    main()
