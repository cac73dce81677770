"""How much does where the tensors land move a same-run comparison? Ours (the public fp8_gemm_nt) against DeepGEMM
HEAD on the same operands, timed interleaved (CUDA graph, L2 flushed, median of 30), once per placement: before the
operands and outputs are allocated, a spacer of OFFSET MiB is allocated (and kept), so every tensor lands elsewhere
in device memory; the caching allocator is emptied between placements. A ratio that moves with the placement more
than between repeats of one placement is the harness's, not the kernel's.

  python dev/placement_ab.py [MxNxK ...] [--offsets 0,1,3,7,33,129] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.helpers, dev.*

DEFAULT_SHAPES = ["64x24576x1536", "64x32768x512", "64x2112x7168", "64x7168x2048", "128x4096x7168", "512x4096x7168"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES)
    parser.add_argument("--offsets", default="0,1,3,7,33,129", help="spacer sizes in MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=2, help="timings per placement")
    args = parser.parse_args()

    import torch

    import deepgemm
    from deepgemm.bench import deepseek
    from deepgemm.tuning.timing import bench_gpu_interleaved
    from tests.helpers import random_operands

    peer = deepseek.load()
    print("| shape | spacer MiB | repeat | ours µs | DeepGEMM µs | DeepGEMM / ours |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes:
        m, n, k = (int(v) for v in shape.split("x"))
        for offset in (int(v) for v in args.offsets.split(",")):
            torch.cuda.empty_cache()
            spacer = torch.empty(offset << 20, dtype=torch.uint8, device="cuda")
            a, b = random_operands(m, n, k, "cuda", seed=5)
            sfa, _ = deepseek.scales(a[1], m, k, is_sfa=True)
            sfb, _ = deepseek.scales(b[1], n, k, is_sfa=False)
            ours_out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            peer_out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            fns = [lambda: deepgemm.fp8_gemm_nt(a, b, ours_out),
                   lambda: peer.fp8_gemm_nt((a[0], sfa), (b[0], sfb), peer_out)]
            for fn in fns:
                fn()
            torch.cuda.synchronize()
            if ours_out.isnan().any() or peer_out.isnan().any():
                raise SystemExit(f"{shape}: an output kept its NaN poison")
            diff = deepgemm.calc_diff(ours_out, peer_out)
            if diff > 1e-4:
                raise SystemExit(f"{shape}: ours and DeepGEMM differ (calc_diff {diff:.1e})")
            for repeat in range(args.repeats):
                ours, theirs = (t.median_us for t in bench_gpu_interleaved(fns))
                print(f"| {shape} | {offset} | {repeat} | {ours:.1f} | {theirs:.1f} | {theirs / ours:.3f} |", flush=True)
            del spacer, a, b, sfa, sfb, ours_out, peer_out, fns


if __name__ == "__main__":
    main()
