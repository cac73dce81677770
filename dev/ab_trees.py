"""Two trees of deepgemm in one process, timed interleaved on the same inputs (a refactor must not move the numbers).

  python dev/ab_trees.py OLD_PACKAGE     e.g. deepgemm_old: another tree's package, renamed (dev/rename_package.sh)

The 18 DeepSeek-V3 dense shapes and the grouped (contiguous, masked) cases of dev/bench_grouped.py: both trees'
public calls on the same operands, outputs compared bitwise on the rows the call defines, then timed interleaved
sample by sample (CUDA-graph replay, L2 flushed, median of 30). Prints a Markdown table.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import deepgemm  # noqa: E402
from deepgemm.bench.suites import suite_shapes  # noqa: E402
from deepgemm.tuning.timing import bench_gpu_interleaved  # noqa: E402
from dev.bench_grouped import contiguous_inputs, issue5_cases, masked_inputs  # noqa: E402
from tests.helpers import random_operands  # noqa: E402


def row(label: str, new_fn, old_fn, new_out: torch.Tensor, old_out: torch.Tensor, valid: torch.Tensor | None,  # noqa: ANN001
        flops: int) -> str:
    new_fn()
    old_fn()
    torch.cuda.synchronize()
    same = torch.equal(new_out[valid], old_out[valid]) if valid is not None else torch.equal(new_out, old_out)
    new_t, old_t = bench_gpu_interleaved([new_fn, old_fn])
    return (f"| {label} | {old_t.median_us:.1f} | {new_t.median_us:.1f} | {flops / new_t.median_us / 1e6:.0f} | "
            f"{new_t.median_us / old_t.median_us:.3f} | {'yes' if same else 'NO'} |")


def main() -> None:
    old = importlib.import_module(sys.argv[1] if len(sys.argv) > 1 else "deepgemm_old")
    print(f"new: {Path(deepgemm.__file__).parent}, old: {Path(old.__file__).parent}")
    print("| case | old µs | new µs | new TFLOPS | new / old | same output |")
    print("|---|---|---|---|---|---|")
    for m, n, k in suite_shapes("deepseek-v3"):
        a, b = random_operands(m, n, k, "cuda")
        new_out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        old_out = torch.empty_like(new_out)
        print(row(f"{m}x{n}x{k}", lambda: deepgemm.fp8_gemm_nt(a, b, new_out), lambda: old.fp8_gemm_nt(a, b, old_out),
                  new_out, old_out, None, 2 * m * n * k), flush=True)
    contiguous, masked = issue5_cases()
    for case in contiguous:
        a, b, m_indices = contiguous_inputs(case)
        new_out = torch.empty(m_indices.numel(), case.n, dtype=torch.bfloat16, device="cuda")
        old_out = torch.empty_like(new_out)
        flops = 2 * sum(case.counts) * case.n * case.k
        print(row(case.label, lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, new_out, m_indices),
                  lambda: old.m_grouped_fp8_gemm_nt_contiguous(a, b, old_out, m_indices), new_out, old_out, None, flops),
              flush=True)
    for case in masked:
        a, b, masked_m = masked_inputs(case)
        new_out = torch.empty(case.groups, case.max_m, case.n, dtype=torch.bfloat16, device="cuda")
        old_out = torch.empty_like(new_out)
        valid = torch.arange(case.max_m, device="cuda")[None, :] < masked_m[:, None]
        flops = 2 * sum(case.counts) * case.n * case.k
        print(row(case.label, lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, new_out, masked_m, case.expected),
                  lambda: old.m_grouped_fp8_gemm_nt_masked(a, b, old_out, masked_m, case.expected), new_out, old_out,
                  valid, flops), flush=True)


if __name__ == "__main__":
    main()
