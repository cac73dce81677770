"""Does the size of a GEMM's parameter block cost GPU time per launch? Our dense FP8 kernel (~1.3 KB of parameters:
ten 128-byte TMA descriptors and the scalars; DeepGEMM HEAD's ~0.5 KB) against the same kernel rebuilt with PAD more
128-byte descriptors appended to its parameters (never read), timed interleaved with DeepGEMM HEAD where it imports
(CUDA graph, L2 flushed, median of 30). Every build is checked bitwise against the unpadded one. If padding by ~1 KB
costs time at decode sizes, a slimmer block (only the descriptors a build reads) is worth that much.

  python dev/param_block_ab.py [MxNxK ...] [--pads 4,8,16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.helpers, dev.*

DEFAULT_SHAPES = ["64x2112x7168", "64x7168x2048", "64x32768x512", "128x4096x7168", "64x256x1024"]
SIGNATURE_END = "float* workspace, deepgemm::u32* counters) {"


def padded_plan(plan, pad: int):  # noqa: ANN001, ANN201 - an Fp8GemmPlan -> a copy launching the padded kernel
    """A copy of `plan` whose kernel takes `pad` more 128-byte descriptors after its own parameters."""
    from deepgemm.jit.args import PackedArgs
    from deepgemm.jit.compiler import KernelSource
    from deepgemm.kernels.common.loader import load_kernel
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import render_source

    source = render_source(plan.spec)
    if SIGNATURE_END not in source.code:
        raise SystemExit("the kernel's signature changed: update SIGNATURE_END")
    extra = ", ".join(f"const __grid_constant__ deepgemm::TmaDescriptor pad{i}" for i in range(pad))
    code = source.code.replace(SIGNATURE_END, SIGNATURE_END[:-3] + f", {extra}) {{")
    padded = copy.copy(plan)
    padded.kernel = load_kernel(KernelSource(code, source.entry, f"{source.label} pad{pad}"),
                                plan.spec.config.smem_bytes, 0)
    padded._args, padded._configs = {}, {}
    base_pack = plan._pack
    padded._pack = lambda *args: PackedArgs(list(base_pack(*args)._values) + [bytes(128)] * pad)
    return padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES)
    parser.add_argument("--pads", default="4,8,16", help="descriptors appended, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import torch

    import deepgemm
    from deepgemm.bench import deepseek
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan
    from deepgemm.tuning.timing import bench_gpu_interleaved
    from dev.dense_tile_ab import peer_call
    from tests.helpers import random_operands, reference_fp64

    pads = [int(v) for v in args.pads.split(",")]
    has_peer = deepseek.missing() is None
    names = ["plain"] + [f"+{p} descriptors" for p in pads] + (["DeepGEMM HEAD"] if has_peer else [])
    print(f"| shape | repeat | {' | '.join(f'{name} µs' for name in names)} | params B |")
    print(f"|---|---|{'---|' * len(names)}---|")
    for shape in args.shapes:
        m, n, k = (int(v) for v in shape.split("x"))
        a, b = random_operands(m, n, k, "cuda", seed=13)
        ref = reference_fp64(a, b)
        plan = get_plan(0, m, n, k, torch.bfloat16)
        plans = [plan] + [padded_plan(plan, p) for p in pads]
        outs = [torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in plans]
        fns = [lambda p=p, o=o: p.launch(a[0], a[1], b[0], b[1], o) for p, o in zip(plans, outs)]
        if has_peer:
            peer_out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            fns.append(peer_call(a, b, peer_out))
        for fn in fns:
            fn()
        torch.cuda.synchronize()
        for pad, out in zip(pads, outs[1:]):
            if not torch.equal(out, outs[0]):
                raise SystemExit(f"{shape}: the +{pad} build's output differs from the plain build's")
        diff = deepgemm.calc_diff(outs[0], ref)
        if diff > 1e-4:
            raise SystemExit(f"{shape}: calc_diff {diff:.1e} against float64")
        sizes = [p.packed_args(a[0], a[1], b[0], b[1], o).nbytes for p, o in zip(plans, outs)]
        for repeat in range(args.repeats):
            times = [t.median_us for t in bench_gpu_interleaved(fns, iters=30, warmup=5)]
            print(f"| {shape} | {repeat} | {' | '.join(f'{t:.2f}' for t in times)} | "
                  f"{' / '.join(str(s) for s in sizes)} |", flush=True)


if __name__ == "__main__":
    main()
