"""A/B of two cost models: time the config each one picks, on every shape where they differ (one device call).

  model_ab.py --dump PICKS.json [--wide]   write this tree's picks for the shape grid (run it in each tree, no GPU);
                                     --wide: WIDE_M x every (N, K) of the grid and the llm-prefill / deepseek-v3
                                     suites (405 shapes)
  model_ab.py --compile OLD.json NEW.json   build both sides' kernels into DEEPGEMM_CACHE_DIR (no GPU)
  model_ab.py OLD.json NEW.json      time both picks where they differ, interleaved (bench_split's time_configs: CUDA
                                     graph, L2 flushed, median of 30) and print a Markdown table
The grid: the DeepSeek-V3 (N, K) pairs and other models' projections, M from 129 (above decode) to 16384.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig  # noqa: E402
from dev.sweep_tools import build_kernels  # noqa: E402

DEEPSEEK_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
DEEPSEEK_M = [160, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192]
OTHER_NK = [(4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096), (28672, 8192), (8192, 28672), (10240, 8192),
            (8192, 8192), (1536, 7168), (576, 7168), (3072, 1536)]
OTHER_M = [256, 1024, 4096]
SMS = 132


WIDE_M = [256, 384, 512, 640, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768]


def grid() -> list[tuple[int, int, int]]:
    return [(m, n, k) for n, k in DEEPSEEK_NK for m in DEEPSEEK_M] + [(m, n, k) for n, k in OTHER_NK for m in OTHER_M]


def wide_grid() -> list[tuple[int, int, int]]:
    """WIDE_M over every (N, K) of grid() and of the llm-prefill and deepseek-v3 suites."""
    from deepgemm.bench.suites import suite_shapes

    shapes = set(grid()) | set(suite_shapes("llm-prefill")) | set(suite_shapes("deepseek-v3"))
    return [(m, n, k) for n, k in sorted({(n, k) for _, n, k in shapes}) for m in WIDE_M]


def dump(path: str, wide: bool = False) -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import choose_fp8_gemm_config

    shapes = wide_grid() if wide else grid()
    picks = {f"{m}x{n}x{k}": dataclasses.asdict(choose_fp8_gemm_config(m, n, k, SMS)) for m, n, k in shapes}
    Path(path).write_text(json.dumps(picks, indent=1))


def differing(old_path: str, new_path: str) -> list[tuple[tuple[int, int, int], GemmConfig, GemmConfig]]:
    old, new = json.loads(Path(old_path).read_text()), json.loads(Path(new_path).read_text())
    cells = []
    for key in new:
        if old.get(key) != new[key]:
            m, n, k = (int(v) for v in key.split("x"))
            cells.append(((m, n, k), GemmConfig(**old[key]), GemmConfig(**new[key])))
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dump", metavar="PICKS.json")
    parser.add_argument("--wide", action="store_true", help="with --dump: the 405-shape grid (wide_grid)")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("picks", nargs="*")
    args = parser.parse_args()
    if args.dump:
        dump(args.dump, args.wide)
        return
    cells = differing(*args.picks)
    if args.compile:
        from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec

        specs = build_kernels(Fp8GemmSpec(n, k, torch.bfloat16, c) for (_, n, k), old, new in cells for c in (old, new))
        print(f"{len(cells)} shapes differ, {len(specs)} kernels built")
        return

    from dev.bench_split import time_configs

    short = lambda c: f"{c.block_m}x{c.block_n}{' sk' if c.split_tail else ''}"  # noqa: E731
    print("| shape | old pick | old µs | new pick | new µs | new / old | calc_diff |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for (m, n, k), old, new in cells:
        (_, _, _, t_old), (_, _, diff, t_new) = time_configs(m, n, k, [old, new], seed=7)
        ratios.append(t_new.median_us / t_old.median_us)
        print(f"| {m}×{n}×{k} | {short(old)} | {t_old.median_us:.1f} | {short(new)} | {t_new.median_us:.1f} | "
              f"{ratios[-1]:.3f} | {diff:.1e} |", flush=True)
    if ratios:
        print(f"\n{len(ratios)} shapes: geomean new/old {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}, "
              f"best {min(ratios):.3f}, worst {max(ratios):.3f}")


if __name__ == "__main__":
    main()
