"""How much does where the tensors land move a same-run comparison? Ours (the public fp8_gemm_nt) against DeepGEMM
HEAD on the same operands (both checked against float64), timed interleaved (CUDA graph, L2 flushed, median of 30), once per placement: before the
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


def time_placement(shape: str, offset_mib: int, repeats: int) -> None:
    """Both GEMMs on fresh operands allocated after an `offset_mib` MiB spacer; checked against float64, then timed
    `repeats` times. Everything allocated here is freed on return."""
    import torch

    import deepgemm
    from deepgemm.tuning.timing import bench_gpu_interleaved
    from dev.dense_tile_ab import peer_call
    from tests.helpers import random_operands, reference_fp64

    m, n, k = (int(v) for v in shape.split("x"))
    torch.cuda.empty_cache()
    spacer = torch.empty(offset_mib << 20, dtype=torch.uint8, device="cuda")
    a, b = random_operands(m, n, k, "cuda", seed=5)
    outs = [torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    fns = [lambda: deepgemm.fp8_gemm_nt(a, b, outs[0]), peer_call(a, b, outs[1])]
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    ref = reference_fp64(a, b)
    for name, out in zip(("ours", "DeepGEMM"), outs):
        diff = deepgemm.calc_diff(out, ref)
        if out.isnan().any() or diff > 1e-4:
            raise SystemExit(f"{shape}: {name} is wrong (calc_diff {diff:.1e} against float64)")
    for repeat in range(repeats):
        ours, theirs = (t.median_us for t in bench_gpu_interleaved(fns))
        print(f"| {shape} | {offset_mib} | {repeat} | {ours:.1f} | {theirs:.1f} | {theirs / ours:.3f} |", flush=True)
    del spacer  # held until the timings are done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES)
    parser.add_argument("--offsets", default="0,1,3,7,33,129", help="spacer sizes in MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=2, help="timings per placement")
    args = parser.parse_args()
    print("| shape | spacer MiB | repeat | ours µs | DeepGEMM µs | DeepGEMM / ours |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes:
        for offset in (int(v) for v in args.offsets.split(",")):
            time_placement(shape, offset, args.repeats)


if __name__ == "__main__":
    main()
