"""Do FP32 FFMAs overlap FP8 wgmma on Hopper? A microbenchmark for the promotion question (one device call).

The M = 4096 ablation (docs/perf-notes.md, session 3) found that the promotion adds its whole FFMA issue
time to the kernel's cycles. This probe runs one CTA per SM with two warpgroups, each in a loop whose
work is set by a role, and reports clock64 cycles per iteration (median over CTAs):
  mma        one 64x128x128 FP8 block (four k32 wgmmas from shared memory), then wait
  ffma       64 FFMAs per thread (one promotion of a 64x128 block)
  mma+ffma   issue the MMAs, run the 64 FFMAs while they fly, then wait (pipelined promotion)
  mma,ffma   issue, wait, then 64 FFMAs (unpipelined promotion)
If `wg0 mma | wg1 ffma` costs about max(mma, ffma) the pipes overlap across warpgroups; about the sum
means they serialize. The shared-memory operands are random e4m3 bytes (no NaN), not zeros.

Usage: overlap_probe.py   (prints a markdown table)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROLE_BITS = {"idle": 0, "mma": 1, "ffma": 2, "mma+ffma": 1 | 4, "mma,ffma": 1 | 8}
CASES = [
    ("mma", "idle"),
    ("ffma", "idle"),
    ("mma", "mma"),
    ("mma", "ffma"),
    ("mma+ffma", "idle"),
    ("mma,ffma", "idle"),
    ("mma+ffma", "mma+ffma"),
    ("mma,ffma", "mma,ffma"),
]
SMEM_BYTES = 32768  # A tile per warpgroup (2 x 8 KB) + one B tile (16 KB)

SOURCE = r"""
#include <deepgemm/ptx/wgmma.cuh>
#include <deepgemm/ptx/wgmma_fp8.cuh>
using namespace deepgemm;
using Mma = ptx::WgmmaFp8<128>;

// 64 FFMAs with a loop-carried dependence (acc = acc * scale + x), so none can be hoisted out of the loop.
DG_DEVICE void ffma_block(float (&acc)[64], const float (&x)[64], float scale) {
#pragma unroll
    for (int j = 0; j < 64; ++j) {
        acc[j] = fmaf(acc[j], scale, x[j]);
    }
}

extern "C" __global__ void __launch_bounds__(256, 1)
overlap_probe(u32 roles, u32 iters, u32 scale_bits, float* sink, unsigned long long* cycles) {
    extern __shared__ __align__(1024) u8 smem[];
    for (u32 i = threadIdx.x; i < 32768 / 4; i += blockDim.x) {
        u32 h = (i + 1) * 2654435761u ^ (blockIdx.x * 40503u);
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        reinterpret_cast<u32*>(smem)[i] = h & 0xB7B7B7B7u;  // exponent <= 0b0110: finite e4m3 values
    }
    __syncthreads();
    const float scale = __uint_as_float(scale_bits);
    const u32 wg = threadIdx.x / 128;
    const u32 role = (roles >> (4 * wg)) & 0xFu;
    const u64 desc_a = ptx::make_smem_desc_k_major_sw128(smem + wg * 8192);
    const u64 desc_b = ptx::make_smem_desc_k_major_sw128(smem + 16384);
    float acc[64];
    float result[64];
    float other[64];
#pragma unroll
    for (int j = 0; j < 64; ++j) {
        acc[j] = 0.0f;
        result[j] = 0.0f;
        other[j] = 1.0f + 1e-3f * static_cast<float>(j + threadIdx.x);
    }
    const unsigned long long start = clock64();
    for (u32 it = 0; it < iters; ++it) {
        if (role & 1u) {
            ptx::mma_k128_block<Mma>(desc_a, desc_b, acc);
            if (role & 4u) {
                ffma_block(result, other, scale);
            }
            ptx::wgmma_wait_group<0>();
            ptx::fence_accumulators(acc);
            if (role & 8u) {
                ffma_block(result, acc, scale);
            }
        } else if (role & 2u) {
            ffma_block(result, other, scale);
        }
    }
    const unsigned long long end = clock64();
    if (threadIdx.x % 128 == 0) {
        cycles[blockIdx.x * 2 + wg] = end - start;
    }
    if (scale_bits == 0x7F800001u) {  // never: keeps every result alive
        float total = 0.0f;
#pragma unroll
        for (int j = 0; j < 64; ++j) {
            total += result[j] + acc[j];
        }
        sink[threadIdx.x] = total;
    }
}
"""


def main() -> None:
    import torch

    from deepgemm.jit.args import U32, U64, PackedArgs
    from deepgemm.jit.compiler import KernelSource
    from deepgemm.jit.runtime import current_raw_stream, launch_on_device
    from deepgemm.kernels.device import sm_count
    from deepgemm.kernels.loader import load_kernel

    torch.zeros(1, device="cuda")
    kernel = load_kernel(KernelSource(code=SOURCE, entry="overlap_probe", label="overlap_probe"), SMEM_BYTES)
    sms = sm_count(0)
    iters = 4000
    sink = torch.empty(256, dtype=torch.float32, device="cuda")
    cycles = torch.zeros(sms * 2, dtype=torch.int64, device="cuda")
    stream = current_raw_stream(0)
    config = kernel.launch_config(0, stream, sms, 256)
    scale_bits = 0x3F000000  # 0.5f
    print("| warpgroup 0 | warpgroup 1 | wg0 cycles/iter | wg1 cycles/iter |")
    print("|---|---|---|---|")
    for wg0, wg1 in CASES:
        roles = ROLE_BITS[wg0] | (ROLE_BITS[wg1] << 4)
        args = PackedArgs([U32(roles), U32(iters), U32(scale_bits), U64(sink.data_ptr()), U64(cycles.data_ptr())])
        for _ in range(3):  # warm up, then keep the last launch's counts
            cycles.zero_()
            launch_on_device(kernel, 0, stream, config, args.address)
        torch.cuda.synchronize()
        per_wg = cycles.view(sms, 2).cpu()
        cells = []
        for wg in range(2):
            values = [int(v) for v in per_wg[:, wg].tolist() if v]
            cells.append(f"{statistics.median(values) / iters:.0f}" if values and (wg1 if wg else wg0) != "idle" else "—")
        print(f"| {wg0} | {wg1} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
