"""2-CTA cluster builds of the FP8 dense GEMM against the model's pick, DeepGEMM HEAD interleaved where it imports.

  python dev/cluster_ab.py [MxNxK ...]      default: the six M = 4096 DeepSeek-V3 shapes

Builds per shape: the model's pick; the same tile with A multicast (cluster_n = 2, where N-blocks pair up), with and
without balanced_grid; with B multicast (cluster_m = 2). One fresh input per shape, timed interleaved (CUDA graph,
L2 flushed, median of 30); our builds must agree bitwise with the model's output, DeepGEMM HEAD within calc_diff.
"""

from __future__ import annotations

import dataclasses
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = ["4096x2112x7168", "4096x24576x1536", "4096x32768x512", "4096x7168x16384", "4096x4096x7168", "4096x7168x2048"]


def builds_for(shape: str, choose, sms: int) -> list:  # noqa: ANN001 - the cost model's choose_fp8_gemm_config
    """(name, config) of each build timed for `shape`."""
    m, n, k = (int(v) for v in shape.split("x"))
    model = choose(m, n, k, sms)
    builds = [("model", model)]
    if -(-n // model.block_n) % 2 == 0 and not (model.split_tail or model.stream_tail):
        builds.append(("A multicast", dataclasses.replace(model, cluster_n=2)))
        builds.append(("A multicast, all SMs", dataclasses.replace(model, cluster_n=2, balanced_grid=False)))
    if model.block_n % 16 == 0 and model.block_m != 192 and not (model.split_tail or model.stream_tail):
        builds.append(("B multicast", dataclasses.replace(model, cluster_m=2)))
    return builds


def main() -> None:
    import torch

    import deepgemm
    from deepgemm.bench import deepseek
    from deepgemm.kernels.common.device import sm_count
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import choose_fp8_gemm_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec
    from deepgemm.tuning.timing import bench_gpu_interleaved
    from tests.helpers import random_operands

    peer = None if deepseek.missing() else deepseek.load()
    sms = sm_count(0)
    shapes = [a for a in sys.argv[1:] if "x" in a] or SHAPES
    plans = {shape: builds_for(shape, choose_fp8_gemm_config, sms) for shape in shapes}
    specs = [Fp8GemmSpec(n=int(s.split("x")[1]), k=int(s.split("x")[2]), out_dtype=torch.bfloat16, config=c)
             for s, builds in plans.items() for _, c in builds]
    with ThreadPoolExecutor(16) as pool:  # compiles run out of process
        list(pool.map(compile_spec, specs))
    print("| shape | build | config | grid | µs | TFLOPS | vs model | check |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        m, n, k = (int(v) for v in shape.split("x"))
        builds = plans[shape]
        a, b = random_operands(m, n, k, "cuda", seed=11)
        rows, fns, baseline = [], [], None
        for name, config in builds:
            try:
                plan = get_plan(0, m, n, k, torch.bfloat16, config=config)
            except (ValueError, RuntimeError) as exc:
                print(f"| {shape} | {name} | {config.label()} | - | - | - | - | {type(exc).__name__}: {exc} |")
                continue
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            plan.launch(a[0], a[1], b[0], b[1], out)
            torch.cuda.synchronize()
            baseline = out.clone() if baseline is None else baseline
            check = "bitwise" if torch.equal(out, baseline) else f"DIFFERS {deepgemm.calc_diff(out, baseline):.1e}"
            rows.append((name, config.label(), plan.grid, check))
            fns.append(lambda plan=plan, out=out: plan.launch(a[0], a[1], b[0], b[1], out))
        if peer is not None:
            sfa, _ = deepseek.scales(a[1], m, k, is_sfa=True)
            sfb, _ = deepseek.scales(b[1], n, k, is_sfa=False)
            peer_out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            peer.fp8_gemm_nt((a[0], sfa), (b[0], sfb), peer_out)
            torch.cuda.synchronize()
            rows.append(("DeepGEMM HEAD", deepseek.version(), "-", f"calc_diff {deepgemm.calc_diff(peer_out, baseline):.1e}"))
            fns.append(lambda: peer.fp8_gemm_nt((a[0], sfa), (b[0], sfb), peer_out))
        timings = bench_gpu_interleaved(fns, iters=30, warmup=5)
        base_us = timings[0].median_us
        for (name, label, grid, check), t in zip(rows, timings):
            us = t.median_us
            print(f"| {shape} | {name} | {label} | {grid} | {us:.1f} | {2 * m * n * k / us / 1e6:.0f} | "
                  f"{us / base_us:.3f} | {check} |", flush=True)


if __name__ == "__main__":
    main()
