"""k-grouped BF16 (expert Wgrad: out[g] += A_g^T B_g, token-major operands, FP32 out) on explicit builds against the
cost model's and against torch._grouped_mm and DeepGEMM HEAD (when importable), interleaved on the same inputs
(CUDA-graph replay, L2 flushed, median of 30). Every build is first checked against per-group FP32 products
(in-place builds as out - c0 after one launch on out = c0).

Builds: the model's pick with C = out (TMA reduce-add stores), with a separate C (loaded in the epilogue) and with
no C; the previous default (128 x 128, 5 stages, no raster, C = out loaded in the epilogue); and the model's C = out
build on other tiles, without the raster band and with bands of 4, 8 and 32 M-blocks.
`--once`: one launch of the model's C = out plan only (for ncu).
`--dense`: dense FP32-output GEMMs (LAYOUT:M:N:K, default DENSE_CASES), the model's pick (a chunked epilogue where
the whole tile's staging would leave too few stages) against its best pick without chunks, interleaved.
Usage: kgrouped_bf16_tiles.py [--once] [G:tokens:M:N ...]   (default: 4:4096:4096:4096 8:4096:7168:7168)
       kgrouped_bf16_tiles.py --dense [LAYOUT:M:N:K ...]
"""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (label, block_n, group_rows or None for the model's, store_n or None for the model's rule) on the C = out build.
VARIANTS = [("128 x 128", 128, None, 0), ("128 x 192", 192, None, 0), ("128 x 256", 256, None, None),
            ("no raster", None, 1, None), ("band 4", None, 4, None), ("band 8", None, 8, None), ("band 32", None, 32, None)]
DENSE_CASES = ["tn:4096:4096:7168", "tn:4096:7168:2048", "nt:4096:4096:7168", "tt:8192:4096:4096", "nt:4096:7168:2048",
               "tn:4096:2112:7168"]


def dense_fp32() -> None:
    import torch

    import deepgemm
    from deepgemm.kernels.common.device import sm_count
    from deepgemm.kernels.sm90_bf16_gemm.cost_model import ranked_configs
    from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem, get_bf16_plan
    from deepgemm.tuning.timing import bench_gpu_interleaved

    cases = [a for a in sys.argv[1:] if not a.startswith("--")] or DENSE_CASES
    print("| case | build | config | µs | TFLOPS | calc_diff |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        layout, *dims = case.split(":")
        m, n, k = (int(v) for v in dims)
        a = torch.randn(k, m, device="cuda") if layout[0] == "t" else torch.randn(m, k, device="cuda")
        b = torch.randn(k, n, device="cuda") if layout[1] == "n" else torch.randn(n, k, device="cuda")
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
        ref = (a.t() if layout[0] == "t" else a).float() @ (b if layout[1] == "n" else b.t()).float()
        ranked = [c for _, c in ranked_configs(bf16_problem(m, n, k, layout, torch.float32, None, sm_count(0)))]
        builds = [("model", ranked[0])]
        for name, chunked in (("best without chunks", False), ("best chunked", True)):
            other = next((c for c in ranked if bool(c.store_n) == chunked), None)
            if other is not None and other != ranked[0]:
                builds.append((name, other))
        rows, fns = [], []
        for name, config in builds:
            plan = get_bf16_plan(0, m, n, k, layout, torch.float32, None, config)
            out = torch.full((m, n), float("nan"), device="cuda")
            plan.launch(a, b, out)
            torch.cuda.synchronize()
            rows.append((name, config.label(), deepgemm.calc_diff(out, ref)))
            fns.append(lambda plan=plan, out=out: plan.launch(a, b, out))
        timings = bench_gpu_interleaved(fns, iters=30, warmup=3)
        for (name, label, diff), t in zip(rows, timings):
            print(f"| {case} | {name} | {label} | {t.median_us:.1f} | {2 * m * n * k / t.median_us / 1e6:.0f} | "
                  f"{diff:.1e} |", flush=True)


def main() -> None:
    import torch

    import deepgemm
    from deepgemm.api.bf16_grouped import _KGROUPED_WHERE, _offsets
    from deepgemm.kernels.common.kind import GemmKind
    from deepgemm.kernels.common.loader import load_kernel
    from deepgemm.kernels.sm90_bf16_gemm.cost_model import stages_for, store_n_for
    from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16Geometry, Bf16GemmPlan, grouped_spec
    from deepgemm.kernels.sm90_bf16_gemm.spec import ADDEND_FP32, render_source
    from deepgemm.tuning.timing import bench_gpu_interleaved

    try:
        import deep_gemm
    except ImportError:
        deep_gemm = None

    args = sys.argv[1:]
    once = "--once" in args
    cases = [a for a in args if not a.startswith("--")] or ["4:4096:4096:4096", "8:4096:7168:7168"]
    rng = random.Random(0)
    fp32 = torch.float32
    print("| case | build | config | µs | TFLOPS | calc_diff |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        groups, tokens, m, n = (int(v) for v in case.split(":"))
        ks = [128 * max(1, round(tokens * rng.uniform(0.7, 1.3) / 128)) for _ in range(groups)]
        k_total = sum(ks)
        a = torch.randn(k_total, m, device="cuda").to(torch.bfloat16)
        b = torch.randn(k_total, n, device="cuda").to(torch.bfloat16)
        c0 = torch.randn(groups, m, n, device="cuda")
        offsets = _offsets.get(a.device, tuple(ks), _KGROUPED_WHERE)
        geometry = Bf16Geometry(m, groups)
        in_place = grouped_spec(GemmKind.K_GROUPED, geometry, n, 0, fp32, fp32, 0, 132, c_in_place=True)
        # (name, spec, how C is passed: "out" in place, "c" a separate tensor, None)
        builds = [("model, C = out", in_place, "out")]
        if not once:
            builds.append(("model, C loaded", grouped_spec(GemmKind.K_GROUPED, geometry, n, 0, fp32, fp32, 0, 132), "c"))
            builds.append(("model, no C", grouped_spec(GemmKind.K_GROUPED, geometry, n, 0, fp32, None, 0, 132), None))
            old = dataclasses.replace(in_place.config, block_m=128, block_n=128, num_stages=stages_for(128, 128, 4),
                                      group_rows=1, store_n=0)
            builds.append(("previous: 128 x 128 g1, C = out loaded",
                           dataclasses.replace(in_place, config=old, addend=ADDEND_FP32), "out-loaded"))
            for label, block_n, group_rows, store_n in VARIANTS:
                bn = block_n or in_place.config.block_n
                sn = store_n_for(128, bn, 4) if store_n is None else store_n
                config = dataclasses.replace(in_place.config, block_n=bn, store_n=sn,
                                             num_stages=stages_for(128, bn, 4, store_n=sn),
                                             group_rows=in_place.config.group_rows if group_rows is None else group_rows)
                if config != in_place.config:
                    builds.append((label + ", C = out", dataclasses.replace(in_place, config=config), "out"))
        bounds = [0] + [sum(ks[: g + 1]) for g in range(groups)]
        ref = torch.stack([a[lo:hi].t().float() @ b[lo:hi].float() for lo, hi in zip(bounds, bounds[1:])])
        rows, fns = [], []
        for name, spec, c_mode in builds:
            plan = Bf16GemmPlan(0, geometry, spec, load_kernel(render_source(spec), spec.smem_bytes, 0))
            out = c0.clone() if c_mode in ("out", "out-loaded") else torch.full_like(c0, float("nan"))
            c = {"out": None, "out-loaded": out, "c": c0, None: None}[c_mode]
            plan.launch(a, b, out, c, offsets)
            torch.cuda.synchronize()
            got = out - c0 if c_mode is not None else out
            rows.append((name, spec.config.label(), deepgemm.calc_diff(got, ref)))
            fns.append(lambda plan=plan, out=out, c=c: plan.launch(a, b, out, c, offsets))
        if once:
            continue
        if deep_gemm is not None and hasattr(deep_gemm, "k_grouped_bf16_gemm_tn_contiguous"):
            ks_tensor = torch.tensor(ks, dtype=torch.int32, device="cuda")
            dg_out = c0.clone()
            deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, dg_out, ks, ks_tensor, dg_out)
            torch.cuda.synchronize()
            rows.append(("DeepGEMM HEAD", "C = out", deepgemm.calc_diff(dg_out - c0, ref)))
            fns.append(lambda: deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, dg_out, ks, ks_tensor, dg_out))
        offs = torch.tensor(bounds[1:], dtype=torch.int32, device="cuda")
        got = torch._grouped_mm(a.t(), b, offs=offs)
        rows.append(("torch._grouped_mm", "BF16 out, no C", deepgemm.calc_diff(got.float(), ref)))
        fns.append(lambda: torch._grouped_mm(a.t(), b, offs=offs))
        timings = bench_gpu_interleaved(fns, iters=30, warmup=3)
        flops = 2 * m * n * k_total
        for (name, label, diff), t in zip(rows, timings):
            print(f"| {case} | {name} | {label} | {t.median_us:.1f} | {flops / t.median_us / 1e6:.0f} | {diff:.1e} |",
                  flush=True)


if __name__ == "__main__":
    if "--dense" in sys.argv:
        dense_fp32()
    else:
        main()
