"""How far ahead of its peers any kernel could be at decode sizes: each decode GEMM timed against a kernel that only
reads as many bytes as the GEMM must move (A, B, D and scales), in the same run, interleaved, with the bench's method.

The read kernel streams a fresh random buffer of that size with 16-byte non-caching loads over a grid of 2-8 CTAs
per SM (the fastest grid per size is picked first) and stores nothing. Its time is the floor no GEMM of that shape
beats under this harness: launch, the flush's dirty write-backs and one pass over the bytes. The table gives, per
shape, the best peer's time over the floor: the largest lead any implementation could have over that peer.

Run under both flushes (`deepgemm bench`'s zeroing flush, and the reading flush that leaves clean lines):

  python dev/read_floor.py [--dtype fp8 bf16] [--shapes MxNxK ...] [--iters 30]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: dev.*

READ_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(512) read_bytes(const uint4* __restrict__ src, unsigned long long n16,
                                                             unsigned int* out) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w) : "l"(src + i + j * stride));
#pragma unroll
        for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    for (; i < n16; i += stride) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src + i));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;  // keeps the loads; (almost) never taken
}
"""

DECODE_SHAPES = [f"{m}x{n}x{k}" for m in (64, 128)
                 for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))]
CTAS_PER_SM = (2, 4, 8)
THREADS = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", nargs="+", default=["fp8", "bf16"], choices=["fp8", "bf16"])
    parser.add_argument("--shapes", nargs="+", default=DECODE_SHAPES)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    import torch

    from deepgemm.bench.inputs import make_problem
    from deepgemm.bench.peers import Unavailable, implementations_for
    from deepgemm.jit.args import U64, PackedArgs
    from deepgemm.jit.compiler import KernelSource
    from deepgemm.jit.runtime import current_raw_stream, launch_on_device
    from deepgemm.kernels.common.loader import load_kernel
    from deepgemm.tuning.timing import bench_gpu_interleaved

    kernel = load_kernel(KernelSource(READ_KERNEL, "read_bytes", "read floor probe"), 0, 0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.empty(8 * sms, dtype=torch.int32, device="cuda")
    print(f"# read floor: {torch.cuda.get_device_name(0)}, {sms} SMs, torch {torch.__version__}, seed {args.seed}, "
          f"median of {args.iters}, CUDA-graph replay, 256 MiB flush before every sample", flush=True)

    def reader(nbytes: int, ctas: int):  # noqa: ANN202
        buffer = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda",
                               generator=torch.Generator(device="cuda").manual_seed(args.seed + nbytes))
        packed = PackedArgs([U64(buffer.data_ptr()), U64(nbytes // 16), U64(sink.data_ptr())])

        def run() -> None:
            stream = current_raw_stream(0)
            launch_on_device(kernel, 0, stream, kernel.launch_config(0, stream, ctas, THREADS), packed.address)
        run.keep = (buffer, packed)  # type: ignore[attr-defined]
        return run

    empty = reader(16, 1)
    for precision in args.dtype:
        # FP8: ours, DeepGEMM, cuBLAS block-wise and per-tensor (not a peer: no scaling); BF16: ours, DeepGEMM, cuBLAS.
        impls = [impl for impl in implementations_for(precision) if impl.operation != "bf16" or precision == "bf16"]
        impls = [impl for impl in impls if impl.missing is None or impl.missing() is None]
        names = [impl.name for impl in impls]
        print(f"\n## {precision} (peers: {', '.join(names[1:])})\n", flush=True)
        for flush_mode in ("zero", "read"):
            print(f"\n### {flush_mode} flush\n")
            print("| shape | MB moved | empty kernel µs | read floor µs (CTAs/SM) | floor GB/s | "
                  + " | ".join(f"{name} µs" for name in names) + " | best peer / floor | ours / floor |")
            print("|---|---|---|---|---|" + "---|" * len(names) + "---|---|", flush=True)
            for shape in args.shapes:
                m, n, k = (int(v) for v in shape.split("x"))
                problem = make_problem((m, n, k), precision, device="cuda", seed=args.seed)
                fns, labels, moved = [], [], []
                for impl in impls:
                    try:
                        prepared = impl.prepare(problem)
                    except Unavailable:
                        continue
                    fns.append(prepared.fn)
                    labels.append(impl.name)
                    moved.append(prepared.bytes)
                nbytes = moved[0] // 16 * 16  # ours (first): A, B, D and scales
                readers = {c: reader(nbytes, c * sms) for c in CTAS_PER_SM}
                probe = bench_gpu_interleaved(list(readers.values()), iters=args.iters, flush_mode=flush_mode)
                best_ctas = min(zip(CTAS_PER_SM, probe), key=lambda pair: pair[1].median_us)[0]
                timings = bench_gpu_interleaved([empty, readers[best_ctas], *fns], iters=args.iters,
                                                flush_mode=flush_mode)
                empty_us, floor_us = timings[0].median_us, timings[1].median_us
                by_name = dict(zip(labels, (t.median_us for t in timings[2:])))
                peers = [us for name, us in by_name.items() if name not in (names[0], "cublas-fp8-tensor")]
                best = min(peers) if peers else float("nan")
                cells = " | ".join(f"{by_name[name]:.1f}" if name in by_name else "n/a" for name in names)
                print(f"| {shape} | {nbytes / 1e6:.1f} | {empty_us:.1f} | {floor_us:.1f} ({best_ctas}) | "
                      f"{nbytes / floor_us / 1e3:.0f} | {cells} | {best / floor_us:.3f} | "
                      f"{by_name.get(names[0], float('nan')) / floor_us:.3f} |", flush=True)
                del problem, fns, readers
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
