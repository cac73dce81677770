"""Split-K at decode sizes: the cost model's pick against every split build the tuner would time, over a grid of
(M, N, K) (one device call). Data for a cost-model rule: split-K won 9-19% at N = 2112, K = 7168 and lost 10% at
64 x 4096 x 7168 (docs/perf-notes.md, session 9), too few points to say where the line is.

For each shape: the model's config and, for each of the model's top candidate tiles that split there
(split_tail_applies), its split build, timed interleaved (CUDA graph, L2 flushed, median of 30) and checked
against the model's output. Prints a markdown table and, last, the tuned entries the winners would make.
Usage: decode_split_sweep.py [--compile-only]   (--compile-only: build every kernel here, no GPU, 132 SMs)
DECODE_SWEEP="M,N,K ..." overrides the grid.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_split's timing loop

MS = (1, 16, 64, 128)
NKS = ((2112, 7168), (4096, 7168), (1536, 7168), (576, 7168), (256, 7168), (7168, 2048))
TOP = 6


def grid() -> list[tuple[int, int, int]]:
    override = os.environ.get("DECODE_SWEEP")
    if override:
        return [tuple(int(v) for v in item.split(",")) for item in override.split()]  # type: ignore[misc]
    return [(m, n, k) for n, k in NKS for m in MS]


def configs_for(m: int, n: int, k: int, num_sms: int) -> list:  # noqa: ANN201 - GemmConfigs, imported lazily
    from deepgemm.configs.heuristics import choose_fp8_gemm_config, make_config, ranked_candidates, split_tail_applies

    # first the plain pick (the cost model without its decode split-K rule), then the model's own pick
    configs = [choose_fp8_gemm_config(m, n, k, num_sms, decode_split=False), choose_fp8_gemm_config(m, n, k, num_sms)]
    for _, block_m, block_n in ranked_candidates(m, n, k, num_sms, 2)[:TOP]:
        if split_tail_applies(m, n, k, block_m, block_n, num_sms):
            configs.append(make_config(m, n, k, block_m, block_n, num_sms, 2, cluster_m=1, split_tail=True))
    return list(dict.fromkeys(configs))


def compile_only() -> None:
    import torch

    from deepgemm.kernels.fp8_gemm import Fp8GemmSpec
    from scripts.sweep_tools import build_kernels

    specs = build_kernels(Fp8GemmSpec(n, k, torch.bfloat16, c) for m, n, k in grid() for c in configs_for(m, n, k, 132))
    print(f"{len(specs)} kernels built")


def main() -> None:
    if "--compile-only" in sys.argv[1:]:
        compile_only()
        return
    from bench_split import time_configs

    from deepgemm.bench.peers import fp8_blockwise_bytes
    from deepgemm.configs.tuning_db import entry_key
    from deepgemm.kernels.device import sm_count

    sms = sm_count(0)
    winners = {}
    from deepgemm.configs.heuristics import choose_fp8_gemm_config

    print("| M×N×K | config (*: the model's pick) | splits | µs | GB/s | vs plain | calc_diff vs plain |")
    print("|---|---|---|---|---|---|---|")
    for m, n, k in grid():
        results = time_configs(m, n, k, configs_for(m, n, k, sms), seed=5)
        model_us = results[0][3].median_us
        model = choose_fp8_gemm_config(m, n, k, sms)
        for config, plan, diff, timing in results:
            us = timing.median_us
            print(f"| {m}×{n}×{k} | {config.label()}{' *' if config == model else ''} | {plan.split_count()} | {us:.1f} | "
                  f"{fp8_blockwise_bytes(m, n, k) / us / 1e3:.0f} | {us / model_us:.3f} | {diff:.1e} |", flush=True)
        best_config, _, _, best = min(results, key=lambda result: result[3].median_us)
        if best_config.split_tail and best.median_us < 0.97 * model_us:  # a split build that wins beyond noise
            winners[entry_key(n, k, 2, sms, m)] = {"block_m": best_config.block_m, "block_n": best_config.block_n,
                                                   "cluster_m": 1, "median_us": round(best.median_us, 1),
                                                   "measured_m": m, "split_tail": True}
    print("\ntuned entries the split winners would make (>3% faster than the model's pick):")
    for key, value in winners.items():
        print(f"  {json.dumps(key)}: {json.dumps(value)},")


if __name__ == "__main__":
    main()
