"""k-grouped BF16 (expert Wgrad: out[g] += A_g^T B_g, token-major operands, FP32 out) on explicit tiles against the
cost model's (with C in place and without C) and torch._grouped_mm, interleaved on the same inputs (CUDA-graph replay, L2 flushed, median of 30);
each checked against per-group FP32 products. `--once`: one launch of the model's plan only (for ncu).
Usage: kgrouped_bf16_tiles.py [--once] [G:tokens:M:N ...]   (default: 4:4096:4096:4096 8:4096:7168:7168)
"""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TILES = [(128, 192), (128, 64)]  # (FP32 64 x 256 and 128 x 256 spill; MN-major B tiles are 64-column multiples)


def main() -> None:
    import torch

    import deepgemm
    from deepgemm.api.bf16_grouped import _KGROUPED_WHERE, _offsets
    from deepgemm.kernels.common.kind import GemmKind
    from deepgemm.kernels.common.loader import load_kernel
    from deepgemm.kernels.sm90_bf16_gemm.cost_model import stages_for
    from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16Geometry, Bf16GemmPlan, grouped_spec
    from deepgemm.kernels.sm90_bf16_gemm.spec import render_source
    from deepgemm.tuning.timing import bench_gpu_interleaved

    args = sys.argv[1:]
    once = "--once" in args
    cases = [a for a in args if not a.startswith("--")] or ["4:4096:4096:4096", "8:4096:7168:7168"]
    rng = random.Random(0)
    print("| case | impl | config | µs | TFLOPS | calc_diff vs torch |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        groups, tokens, m, n = (int(v) for v in case.split(":"))
        ks = [128 * max(1, round(tokens * rng.uniform(0.7, 1.3) / 128)) for _ in range(groups)]
        k_total = sum(ks)
        a = torch.randn(k_total, m, device="cuda").to(torch.bfloat16)
        b = torch.randn(k_total, n, device="cuda").to(torch.bfloat16)
        offsets = _offsets.get(a.device, tuple(ks), _KGROUPED_WHERE)
        geometry = Bf16Geometry(m, groups)
        base = grouped_spec(GemmKind.K_GROUPED, geometry, n, 0, torch.float32, torch.float32, 0, 132)
        specs = [("model", base)]
        if not once:  # the same tile without C (out = A^T B, as torch computes it): what the C read costs
            specs.append(("model, no C", grouped_spec(GemmKind.K_GROUPED, geometry, n, 0, torch.float32, None, 0, 132)))
        if not once:
            for bm, bn in TILES:
                stages = stages_for(bm, bn, 4)
                config = dataclasses.replace(base.config, block_m=bm, block_n=bn, num_stages=stages)
                if stages >= 2 and config != base.config:
                    specs.append(("tile", dataclasses.replace(base, config=config)))
        offs = torch.tensor([sum(ks[: g + 1]) for g in range(groups)], dtype=torch.int32, device="cuda")
        bounds = [0] + [sum(ks[: g + 1]) for g in range(groups)]
        ref = torch.stack([a[lo:hi].t().float() @ b[lo:hi].float() for lo, hi in zip(bounds, bounds[1:])])
        rows, fns = [], []
        for name, spec in specs:
            plan = Bf16GemmPlan(0, geometry, spec, load_kernel(render_source(spec), spec.smem_bytes, 0))
            out = torch.zeros(groups, m, n, device="cuda")
            c = out if spec.addend else None
            plan.launch(a, b, out, c, offsets)
            torch.cuda.synchronize()
            rows.append((name, spec.config.label(), deepgemm.calc_diff(out, ref)))
            fns.append(lambda plan=plan, out=out, c=c: plan.launch(a, b, out, c, offsets))
        if once:
            continue
        rows.append(("torch._grouped_mm", "BF16 out, no C", 0.0))
        fns.append(lambda: torch._grouped_mm(a.t(), b, offs=offs))
        timings = bench_gpu_interleaved(fns, iters=30, warmup=3)
        flops = 2 * m * n * k_total
        for (name, label, diff), t in zip(rows, timings):
            print(f"| {case} | {name} | {label} | {t.median_us:.1f} | {flops / t.median_us / 1e6:.0f} | {diff:.1e} |",
                  flush=True)


if __name__ == "__main__":
    main()
