"""BF16 contiguous grouped GEMM (m_indices form) on explicit tiles against the cost model's pick and DeepGEMM HEAD,
interleaved on the same inputs (CUDA-graph replay, L2 flushed, median of 30); with --dense-twin also dense BF16 NT
GEMMs of the same rows on each tile (the tile's cost, free of the grouped walk). Every build's valid rows are
checked against the model's build (calc_diff), DeepGEMM's too. Cases and token counts: dev/bench_grouped_bf16.py's
contiguous cases (seed 0).

Usage: python3 dev/bf16_contiguous_tiles.py [--tiles 128x128,128x256,...] [--only SUBSTRING] [--dense-twin]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import deepgemm  # noqa: E402
from deepgemm.kernels.common.kind import GemmKind  # noqa: E402
from deepgemm.kernels.common.loader import load_kernel  # noqa: E402
from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config  # noqa: E402
from deepgemm.kernels.sm90_bf16_gemm.plan import (Bf16Geometry, Bf16GemmPlan, bf16_problem, get_bf16_plan,  # noqa: E402
                                                  grouped_problem, grouped_spec)
from deepgemm.kernels.sm90_bf16_gemm.spec import render_source  # noqa: E402
from deepgemm.tuning.timing import bench_gpu_interleaved  # noqa: E402
from dev.bench_grouped_bf16 import build_cases, contiguous_m_indices, random_bf16  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", default="128x128,128x256,128x192")
    parser.add_argument("--only", default="")
    parser.add_argument("--dense-twin", action="store_true")
    args = parser.parse_args()
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
    try:
        import deep_gemm
    except ImportError:
        deep_gemm = None
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)}, {sms} SMs")
    print("| case | build | config | µs | TFLOPS | calc_diff vs the model's build |")
    print("|---|---|---|---|---|---|")
    for case in build_cases(0):
        if case.kind != "contiguous" or args.only not in case.label:
            continue
        host = contiguous_m_indices(case.counts)
        m_total, n, k = len(host), case.n, case.k
        m_indices = torch.tensor(host, dtype=torch.int32, device="cuda")
        valid = m_indices >= 0
        a = random_bf16((m_total, k), 1, 1.0)
        b = random_bf16((case.groups, n, k), 2, 0.5)
        geometry = Bf16Geometry(m_total, case.groups)
        model = grouped_spec(GemmKind.GROUPED_CONTIGUOUS, geometry, n, k, torch.bfloat16, None, 0, sms)
        problem = grouped_problem(GemmKind.GROUPED_CONTIGUOUS, geometry, n, k, torch.bfloat16, None, 0, sms)
        specs = [("model", model)] + [(f"{bm}x{bn}", dataclasses.replace(model, config=make_config(problem, bm, bn)))
                                      for bm, bn in tiles if (bm, bn) != (model.config.block_m, model.config.block_n)]
        names, fns, outs = [], [], []
        for name, spec in specs:
            plan = Bf16GemmPlan(0, geometry, spec, load_kernel(render_source(spec), spec.smem_bytes, 0))
            out = torch.full((m_total, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            names.append((name, spec.config.label()))
            fns.append(lambda plan=plan, out=out: plan.launch(a, b, out, None, m_indices))
            outs.append(out)
        if deep_gemm is not None:
            out = torch.full((m_total, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            names.append(("DeepGEMM HEAD", "-"))
            fns.append(lambda out=out: deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, out, m_indices))
            outs.append(out)
        for fn in fns:
            fn()
        torch.cuda.synchronize()
        diffs = [f"{deepgemm.calc_diff(o[valid], outs[0][valid]):.1e}" for o in outs]
        rows = int(valid.sum())
        if args.dense_twin:
            model_tile = (model.config.block_m, model.config.block_n)
            for bm, bn in [model_tile] + [t for t in tiles if t != model_tile]:
                config = make_config(bf16_problem(rows, n, k, "nt", torch.bfloat16, None, sms), bm, bn)
                plan = get_bf16_plan(0, rows, n, k, "nt", torch.bfloat16, None, config)
                da, db = a[:rows], b[0]
                out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
                names.append((f"dense {rows}x{n}x{k}", config.label()))
                fns.append(lambda plan=plan, out=out, da=da, db=db: plan.launch(da, db, out))
                diffs.append("-")
        timings = bench_gpu_interleaved(fns, iters=30, warmup=3)
        for (name, label), diff, t in zip(names, diffs, timings):
            print(f"| {case.label} ({rows} rows) | {name} | {label} | {t.median_us:.1f} | "
                  f"{2 * rows * n * k / t.median_us / 1e6:.0f} | {diff} |", flush=True)


if __name__ == "__main__":
    main()
