"""deepgemm against cuBLAS block-wise across M for the DeepSeek-V3 (N, K) pairs: where are the cliffs?

Each shape is timed with the benchmark's own harness (CUDA-graph replay, L2 flushed, median of 30, deepgemm and
cuBLAS block-wise interleaved round by round), so a row is directly comparable with `deepgemm bench`.
Usage: m_sweep.py [--compile-only] [--m 16,48,...] [--nk 2112x7168,...]
  --compile-only  build (or fetch from DEEPGEMM_CACHE_DIR) the kernel each shape would run, without a GPU.
Prints a Markdown table: µs of both, the ratio, and the config deepgemm ran.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from scripts.sweep_tools import add_shape_grid, build_kernels, shape_grid  # noqa: E402

DEFAULT_M = (16, 48, 80, 96, 112, 160, 192, 256, 320, 384, 512, 768, 1024, 1536, 2048, 3072)
GPU_NAME = "NVIDIA H200"


def compile_all(shapes: list[tuple[int, int, int]]) -> None:
    from deepgemm.kernels.fp8_gemm import plan_spec

    build_kernels((plan_spec(m, n, k, torch.bfloat16, 132, GPU_NAME) for m, n, k in shapes), print_each=True)


def time_all(shapes: list[tuple[int, int, int]]) -> None:
    from deepgemm.bench.peers import CUBLAS_BLOCKWISE, DEEPGEMM_FP8
    from deepgemm.bench.inputs import make_problem
    from deepgemm.bench.runner import BenchSettings, measure_all
    from deepgemm.kernels.fp8_gemm import plan_spec

    settings = BenchSettings(precision="fp8")
    print("| M×N×K | deepgemm µs | cuBLAS block-wise µs | deepgemm / cuBLAS speed | TFLOPS | config |")
    print("|---|---|---|---|---|---|")
    for m, n, k in shapes:
        problem = make_problem((m, n, k), "fp8", device="cuda", seed=settings.seed)
        ours, theirs = measure_all((DEEPGEMM_FP8, CUBLAS_BLOCKWISE), problem, settings)
        del problem
        torch.cuda.empty_cache()
        label = plan_spec(m, n, k, torch.bfloat16, torch.cuda.get_device_properties(0).multi_processor_count,
                          torch.cuda.get_device_name(0)).label()
        t_ours = ours.median_us if ours.status == "ok" else None
        t_theirs = theirs.median_us if theirs.status == "ok" else None
        ratio = f"{t_theirs / t_ours:.3f}" if t_ours and t_theirs else "—"
        tflops = f"{2 * m * n * k / t_ours / 1e6:.0f}" if t_ours else ours.status
        print(f"| {m}×{n}×{k} | {t_ours or ours.status} | {t_theirs or theirs.status} | {ratio} | {tflops} | {label} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    add_shape_grid(parser, DEFAULT_M)
    args = parser.parse_args()
    shapes = shape_grid(args)
    if args.compile_only:
        compile_all(shapes)
    else:
        time_all(shapes)


if __name__ == "__main__":
    main()
