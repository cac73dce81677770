"""Does the output's row pitch (or N itself) change the FP8 GEMM's speed? (one device call)

For each case, fp8_gemm_nt through the public API writes an [M, N] output that is a view of an [M, pitch] buffer;
all cases of one group are timed interleaved (CUDA graph, L2 flushed, median of 30). A power-of-two pitch that runs
slower than a padded one at the same N points at the output stores; N = 4032 against 4096 at the same pitch points
at the tile schedule. Usage: pitch_probe.py [M,N,K,pitch ...] (groups separated by "/")
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

DEFAULT = ("16384,4096,7168,4096 16384,4096,7168,4160 16384,4032,7168,4032 16384,4032,7168,4096 / "
           "4096,4096,7168,4096 4096,4096,7168,4160 4096,4032,7168,4032 / "
           "4096,32768,512,32768 4096,32768,512,32832 / 4096,24576,1536,24576 4096,24576,1536,24640")


def main() -> None:
    import deepgemm
    from deepgemm.api import gemm
    from deepgemm.bench.timing import bench_gpu_interleaved
    from tests.helpers import random_operands

    spec = " ".join(sys.argv[1:]) or DEFAULT
    print("| M×N×K | out pitch | tile | µs | TFLOPS | calc_diff vs the first case of that shape |")
    print("|---|---|---|---|---|---|")
    for group in spec.split("/"):
        cases = [tuple(int(v) for v in item.split(",")) for item in group.split()]
        launches, labels, outs = [], [], []
        operands = {}
        for m, n, k, pitch in cases:
            if (m, n, k) not in operands:
                operands[(m, n, k)] = random_operands(m, n, k, "cuda", seed=5)
            a, b = operands[(m, n, k)]
            out = torch.full((m, pitch), float("nan"), dtype=torch.bfloat16, device="cuda")[:, :n]
            deepgemm.fp8_gemm_nt(a, b, out)
            plan = gemm._ready[gemm._metadata_key(a[0], a[1], b[0], b[1], out)][0]
            labels.append(plan.spec.config)
            outs.append(out)
            launches.append(lambda a=a, b=b, out=out: deepgemm.fp8_gemm_nt(a, b, out))
        timings = bench_gpu_interleaved(launches, iters=30, warmup=5)
        for (m, n, k, pitch), config, out, timing in zip(cases, labels, outs, timings):
            first = next(o for o, c in zip(outs, cases) if c[:3] == (m, n, k))  # same shape, same operands
            diff = deepgemm.calc_diff(out, first)
            print(f"| {m}×{n}×{k} | {pitch} | {config.block_m}x{config.block_n} | {timing.median_us:.1f} | "
                  f"{2 * m * n * k / timing.median_us / 1e6:.0f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
