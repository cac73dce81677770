"""Split tail / split-K against the cost model's pick, same harness, back to back (one device call).

For each shape: the model's config, then explicit split-tail configs (bm, bn), timed with CUDA-graph
replay, L2 flushed before each call, median of 30, and checked against the model's output
(calc_diff). Prints a markdown table: µs, TFLOPS, GB/s (A + B + D + scales once), splits.
Usage: bench_split.py   (shapes and tiles below; SPLIT_SHAPES="MxNxK:bm,bn;bm,bn MxNxK:..." overrides)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT = {
    "4096x2112x7168": [(128, 128), (256, 128)],
    "64x2112x7168": [(64, 128), (64, 64)],
    "64x4096x7168": [(64, 128)],
    "64x7168x16384": [(64, 128)],
    "128x2112x7168": [(128, 128), (64, 128)],
    "128x4096x7168": [(128, 128)],
    "64x7168x2048": [(64, 128)],
}


def shapes() -> dict[str, list[tuple[int, int]]]:
    override = os.environ.get("SPLIT_SHAPES")
    if not override:
        return DEFAULT
    parsed: dict[str, list[tuple[int, int]]] = {}
    for item in override.split():
        shape, tiles = item.split(":")
        parsed[shape] = [(int(t.split(",")[0]), int(t.split(",")[1])) for t in tiles.split(";")]
    return parsed


def launcher(plan: Any, a: Any, b: Any, out: Any) -> Callable[[], None]:
    return lambda: plan.launch(a[0], a[1], b[0], b[1], out)


def main() -> None:
    import torch

    import deepgemm
    from deepgemm.bench.peers import fp8_blockwise_bytes
    from deepgemm.bench.timing import bench_gpu
    from deepgemm.configs.heuristics import choose_fp8_gemm_config, make_config
    from deepgemm.kernels.device import sm_count
    from deepgemm.kernels.fp8_gemm import get_plan
    from tests.helpers import random_operands

    sms = sm_count(0)
    print("| shape | config | splits | µs | TFLOPS | GB/s | calc_diff vs model |")
    print("|---|---|---|---|---|---|---|")
    for shape, tiles in shapes().items():
        m, n, k = (int(v) for v in shape.split("x"))
        a, b = random_operands(m, n, k, "cuda", seed=3)
        configs = [choose_fp8_gemm_config(m, n, k, sms)]
        configs += [make_config(m, n, k, bm, bn, sms, 2, cluster_m=1, split_tail=True) for bm, bn in tiles]
        baseline = None
        for config in configs:
            plan = get_plan(0, m, n, k, torch.bfloat16, config)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            plan.launch(a[0], a[1], b[0], b[1], out)
            torch.cuda.synchronize()
            baseline = out.clone() if baseline is None else baseline
            diff = deepgemm.calc_diff(out, baseline)
            timing = bench_gpu(launcher(plan, a, b, out), iters=30, warmup=5)
            us = timing.median_us
            splits = plan.split_count() if config.split_tail else 1
            print(f"| {shape} | {config.label()} | {splits} | {us:.1f} | {2 * m * n * k / us / 1e6:.0f} | "
                  f"{fp8_blockwise_bytes(m, n, k) / us / 1e3:.0f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
