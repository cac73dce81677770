"""Candidate tiles at mid-size M (prefill chunks, 160-3072 rows) timed against the cost model's pick, one device call.

A sweep against cuBLAS block-wise (benchmarks/h200-m-sweep.md) found the model's pick below it by up to 9% at
M = 160-3072 on the DeepSeek-V3 (N, K) pairs. For each shape this times the model's config and a fixed set of alternatives (block_m 64/128/192/256,
block_m 192 as the cost model builds it), interleaved (CUDA graph, L2 flushed, median of 30: bench_split's
time_configs), and prints the model's pick, the best and each config's time relative to the best; all timings go
to $OUT/mid_m_tune.json.
Usage: mid_m_tune.py [--compile-only] [--m 160,256,...] [--nk 2112x7168,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig  # noqa: E402
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import choose_fp8_gemm_config, make_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import model_split_tail  # noqa: E402
from deepgemm.kernels.sm90_fp8_gemm_1d2d.smem import max_stages  # noqa: E402
from dev.sweep_tools import add_shape_grid, build_kernels, shape_grid  # noqa: E402

DEFAULT_M = (160, 256, 384, 768, 1536, 2048, 3072)
TILES = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 192), (192, 128), (256, 128))
SMS = 132


def candidates(m: int, n: int, k: int) -> list[GemmConfig]:
    """The model's pick first, then every fixed tile that fits (block_m 192 with the model's split-tail choice)."""
    model = choose_fp8_gemm_config(m, n, k, SMS)
    configs = [model]
    for bm, bn in TILES:
        if bn > max(n, 16) + 64 or bm > 2 * m or max_stages(bm, bn, k, 2) < 2:
            continue
        config = make_config(m, n, k, bm, bn, SMS, 2, cluster_m=1, split_tail=model_split_tail(m, n, k, bm, bn, SMS))
        if config not in configs:
            configs.append(config)
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    add_shape_grid(parser, DEFAULT_M)
    args = parser.parse_args()
    jobs = {shape: candidates(*shape) for shape in shape_grid(args)}
    if args.compile_only:
        from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec

        specs = build_kernels(Fp8GemmSpec(n, k, torch.bfloat16, c) for (_, n, k), cs in jobs.items() for c in cs)
        print(f"{len(specs)} kernels built")
        return

    from dev.bench_split import time_configs

    results = []
    print("| shape | model's pick | model µs | best | best µs | model / best | others (µs / best) |")
    print("|---|---|---|---|---|---|---|")
    for (m, n, k), configs in jobs.items():
        timed = [(timing.median_us, config, diff) for config, _, diff, timing in time_configs(m, n, k, configs, seed=5)]
        bad = [config.label() for _, config, diff in timed if diff > 1e-3]
        model_us = timed[0][0]
        ranked = sorted(timed, key=lambda item: item[0])
        best_us, best, _ = ranked[0]
        short = lambda c: f"{c.block_m}x{c.block_n}{' sk' if c.split_tail else ''}"  # noqa: E731
        others = ", ".join(f"{short(c)} {us:.1f} ({us / best_us:.2f})" for us, c, _ in ranked[1:])
        print(f"| {m}×{n}×{k} | {short(configs[0])} | {model_us:.1f} | {short(best)} | {best_us:.1f} | "
              f"{model_us / best_us:.3f} | {others}{' MISMATCH ' + str(bad) if bad else ''} |", flush=True)
        results.append({"shape": [m, n, k], "model": configs[0].label(),
                        "timed": [[us, c.label(), c.block_m, c.block_n, c.split_tail] for us, c, _ in ranked]})
    path = os.path.join(os.environ.get("OUT", "."), "mid_m_tune.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
