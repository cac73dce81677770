"""Split tail / stream tail / split-K against the cost model's pick, same harness, one device call.

For each shape: the model's config, then explicit configs (bm, bn and a tail mode: split by default,
stream, or whole; optionally a raster band height group_m), timed interleaved (one sample of each per round) with CUDA-graph replay, L2 flushed
before each call, median of 30, and checked against the model's output (calc_diff). Prints a markdown
table: µs, TFLOPS, GB/s (A + B + D + scales once), splits.
Usage: bench_split.py   (shapes and tiles below; SPLIT_SHAPES="MxNxK:bm,bn[,mode[,gm]];... MxNxK:..." overrides)
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT = {
    "4096x4096x7168": [(256, 128, "whole"), (256, 128, "stream")],
    "4096x7168x16384": [(256, 128, "whole"), (256, 128, "stream")],
    "4096x2112x7168": [(128, 192, "whole"), (128, 192, "stream")],
    "4096x7168x2048": [(256, 128, "whole"), (256, 128, "stream")],
    "4096x4224x7168": [(256, 128, "whole"), (256, 128, "stream")],  # whole waves: the stream build, nothing split
    "64x2112x7168": [(64, 128, "split"), (64, 64, "split")],
    "64x7168x16384": [(64, 128, "split")],
}


def shapes() -> dict[str, list[tuple[int, int, str] | tuple[int, int, str, int]]]:
    override = os.environ.get("SPLIT_SHAPES")
    if not override:
        return DEFAULT
    parsed: dict[str, list[tuple[int, int, str] | tuple[int, int, str, int]]] = {}
    for item in override.split():
        shape, tiles = item.split(":")
        parsed[shape] = []
        for tile in tiles.split(";"):
            bm, bn, *rest = tile.split(",")
            mode = rest[0] if rest else "split"
            parsed[shape].append((int(bm), int(bn), mode, int(rest[1])) if len(rest) > 1 else (int(bm), int(bn), mode))
    return parsed


def time_configs(m: int, n: int, k: int, configs: list, seed: int) -> list[tuple[Any, Any, float, Any]]:
    """(config, plan, calc_diff against the first config's output, timing) for each config on one fresh random
    input, timed interleaved (CUDA graph, L2 flushed, median of 30). Each plan runs eagerly first, so a split
    plan's captured launches take counters from the zeroed arena (no memset node), as a warmed-up user's do."""
    import torch

    import deepgemm
    from deepgemm.tuning.timing import bench_gpu_interleaved
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan
    from tests.helpers import random_operands

    a, b = random_operands(m, n, k, "cuda", seed=seed)
    plans, launches, diffs, baseline = [], [], [], None
    for config in configs:
        plan = get_plan(0, m, n, k, torch.bfloat16, config=config)
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        plan.launch(a[0], a[1], b[0], b[1], out)
        torch.cuda.synchronize()
        baseline = out.clone() if baseline is None else baseline
        diffs.append(deepgemm.calc_diff(out, baseline))
        plans.append(plan)
        launches.append(lambda plan=plan, out=out: plan.launch(a[0], a[1], b[0], b[1], out))
    timings = bench_gpu_interleaved(launches, iters=30, warmup=5)
    return list(zip(configs, plans, diffs, timings))


def main() -> None:
    from deepgemm.bench.peers import fp8_blockwise_bytes
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import choose_fp8_gemm_config, make_config
    from deepgemm.kernels.common.device import sm_count

    sms = sm_count(0)
    print("| shape | config | splits | µs | TFLOPS | GB/s | calc_diff vs model |")
    print("|---|---|---|---|---|---|---|")
    for shape, tiles in shapes().items():
        m, n, k = (int(v) for v in shape.split("x"))
        configs = [choose_fp8_gemm_config(m, n, k, sms)]
        for bm, bn, mode, *group_m in tiles:
            config = make_config(m, n, k, bm, bn, sms, 2, cluster_m=1, split_tail=mode == "split", stream_tail=mode == "stream")
            configs.append(replace(config, group_m=group_m[0]) if group_m else config)
        for config, plan, diff, timing in time_configs(m, n, k, configs, seed=3):
            us = timing.median_us
            print(f"| {shape} | {config.label()} | {plan.split_count()} | {us:.1f} | {2 * m * n * k / us / 1e6:.0f} | "
                  f"{fp8_blockwise_bytes(m, n, k) / us / 1e3:.0f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
