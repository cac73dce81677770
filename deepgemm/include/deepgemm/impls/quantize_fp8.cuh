// One-pass FP8 (e4m3) quantization kernels producing the scale layouts the FP8 GEMM reads.
//   per-token-group: x [M,K] -> q [M,K] e4m3, sf[g, m] = amax(x[m, g*G : (g+1)*G]) / 448 stored M-major
//                    (element (m, g) at sf + g * sf_stride + m; sf_stride = M rounded up to 4).
//   per-block:       w [N,K] -> q [N,K] e4m3, sf[nb, kb] = amax of the B x B block / 448, row-major.
//   gated (kSiluMul): x [M, 2K] holds [gate | up]; the quantized values are silu(gate) * up in float32
//                    (no rounding in between), a fused MLP activation, with the per-token-group layout above.
// The scale is max(amax / 448, FLT_MIN): an all-zero group gets a tiny positive scale and zeros, never
// NaN or Inf. q = x / scale (IEEE division), rounded to nearest-even and saturated to +-448. A NaN in a
// group makes its scale (and q) NaN, matching the CPU reference.
#pragma once
#include <deepgemm/elementwise/elements.cuh>
#include <deepgemm/ptx/sync.cuh>

namespace deepgemm {

enum class Activation : int { kNone = 0, kSiluMul = 1 };

// silu(g) * u = g / (1 + e^-g) * u (e^-g overflowing to inf gives -0 * u, the limit; NaN stays NaN).
DG_DEVICE float silu_mul(float gate, float up) {
    return gate / (1.0f + expf(-gate)) * up;
}

DG_DEVICE float fp8_scale_for(float amax) {
    constexpr float kE4m3Max = 448.0f;
    constexpr float kFloatMin = 1.17549435e-38f;
    return max_nan(amax / kE4m3Max, kFloatMin);
}

DG_DEVICE u8 to_e4m3(float value) {
    return static_cast<u8>(ptx::pack_e4m3x2(value, 0.0f) & 0xFF);
}

DG_DEVICE float warp_max(float value) {
#pragma unroll
    for (u32 offset = 16; offset > 0; offset /= 2) {
        value = max_nan(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
    }
    return value;
}

// Per (row, group): scale = amax / 448 and q = x / scale. Two paths with bit-identical results:
//   vectorized (the host passes it when x's base and rows are 16-byte aligned and K and q's row stride are multiples
//     of the vector): kLanes lanes per group, each loading 16-byte vectors and storing 4/8 e4m3 bytes at once, so a
//     warp covers 32 / kLanes groups (two for bf16 with G = 128);
//   scalar (any layout): one warp per group, lane l handling columns l, l + 32, ...
template <InputKind kKind, u32 kGroupSize, Activation kAct = Activation::kNone>
struct QuantizePerTokenGroup {
    static_assert(kGroupSize % 32 == 0 && kGroupSize <= 1024, "group size must be a multiple of 32, at most 1024");
    static constexpr u32 kPerLane = kGroupSize / 32;
    static constexpr u32 kInputBytes = kKind == InputKind::kFloat32 ? 4 : 2;
    static constexpr u32 kVec = 16 / kInputBytes;
    static constexpr u32 kLanes = kGroupSize / kVec < 32 ? kGroupSize / kVec : 32;
    static constexpr u32 kVecsPerLane = kGroupSize / (kVec * kLanes);
    static constexpr u32 kGroupsPerWarp = 32 / kLanes;

    DG_DEVICE static void run(const void* x, u64 x_row_stride, u8* q, u64 q_row_stride, float* sf, u32 sf_stride, u32 m,
                              u32 k, u32 vectorized) {
        ptx::programmatic_launch_sync();
        if (vectorized) {
            run_vectorized(x, x_row_stride, q, q_row_stride, sf, sf_stride, m, k);
        } else {
            run_scalar(x, x_row_stride, q, q_row_stride, sf, sf_stride, m, k);
        }
    }

    DG_DEVICE static void run_vectorized(const void* x, u64 x_row_stride, u8* q, u64 q_row_stride, float* sf,
                                         u32 sf_stride, u32 m, u32 k) {
        const u32 groups_per_row = ceil_div(k, kGroupSize);
        const u64 warp = (static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
        const u32 lane = threadIdx.x % 32, sub = lane % kLanes;
        const u64 item = warp * kGroupsPerWarp + lane / kLanes;
        const bool valid = item < static_cast<u64>(m) * groups_per_row;  // every lane stays for the shuffles
        const u32 row = valid ? static_cast<u32>(item / groups_per_row) : 0;
        const u32 group = valid ? static_cast<u32>(item % groups_per_row) : 0;
        float values[kVecsPerLane][kVec];
        float amax = 0.0f;
#pragma unroll
        for (u32 v = 0; v < kVecsPerLane; ++v) {
            const u32 col = group * kGroupSize + (v * kLanes + sub) * kVec;
            if (valid && col < k) {
                const u8* address = static_cast<const u8*>(x) + (row * x_row_stride + col) * kInputBytes;
                load_vector_as_float<kKind>(address, values[v]);
                if constexpr (kAct == Activation::kSiluMul) {
                    float up[kVec];  // k columns further on (the host checks that k keeps it 16-byte aligned)
                    load_vector_as_float<kKind>(address + static_cast<u64>(k) * kInputBytes, up);
#pragma unroll
                    for (u32 i = 0; i < kVec; ++i) values[v][i] = silu_mul(values[v][i], up[i]);
                }
            } else {
#pragma unroll
                for (u32 i = 0; i < kVec; ++i) values[v][i] = 0.0f;
            }
#pragma unroll
            for (u32 i = 0; i < kVec; ++i) amax = max_nan(amax, fabsf(values[v][i]));
        }
#pragma unroll
        for (u32 offset = kLanes / 2; offset > 0; offset /= 2) {
            amax = max_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
        }
        const float scale = fp8_scale_for(amax);
#pragma unroll
        for (u32 v = 0; v < kVecsPerLane; ++v) {
            const u32 col = group * kGroupSize + (v * kLanes + sub) * kVec;
            if (valid && col < k) {
                u32 words[kVec / 4];
#pragma unroll
                for (u32 w = 0; w < kVec / 4; ++w) {
                    const float* f = values[v] + 4 * w;
                    words[w] = static_cast<u32>(ptx::pack_e4m3x2(f[0] / scale, f[1] / scale)) |
                               (static_cast<u32>(ptx::pack_e4m3x2(f[2] / scale, f[3] / scale)) << 16);
                }
                u8* target = q + row * q_row_stride + col;
                if constexpr (kVec == 8) {
                    *reinterpret_cast<uint2*>(target) = make_uint2(words[0], words[1]);
                } else {
                    *reinterpret_cast<u32*>(target) = words[0];
                }
            }
        }
        if (valid && sub == 0) {
            sf[static_cast<u64>(group) * sf_stride + row] = scale;
        }
    }

    DG_DEVICE static void run_scalar(const void* x, u64 x_row_stride, u8* q, u64 q_row_stride, float* sf, u32 sf_stride,
                                     u32 m, u32 k) {
        const u32 groups_per_row = ceil_div(k, kGroupSize);
        const u64 warp = (static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
        const u32 lane = threadIdx.x % 32;
        if (warp >= static_cast<u64>(m) * groups_per_row) {
            return;
        }
        const u32 row = static_cast<u32>(warp / groups_per_row);
        const u32 group = static_cast<u32>(warp % groups_per_row);
        float values[kPerLane];
        float amax = 0.0f;
#pragma unroll
        for (u32 i = 0; i < kPerLane; ++i) {
            const u32 col = group * kGroupSize + i * 32 + lane;
            values[i] = col < k ? load_as_float<kKind>(x, row * x_row_stride + col) : 0.0f;
            if constexpr (kAct == Activation::kSiluMul) {
                if (col < k) values[i] = silu_mul(values[i], load_as_float<kKind>(x, row * x_row_stride + col + k));
            }
            amax = max_nan(amax, fabsf(values[i]));
        }
        const float scale = fp8_scale_for(warp_max(amax));
#pragma unroll
        for (u32 i = 0; i < kPerLane; ++i) {
            const u32 col = group * kGroupSize + i * 32 + lane;
            if (col < k) {
                q[row * q_row_stride + col] = to_e4m3(values[i] / scale);
            }
        }
        if (lane == 0) {
            sf[static_cast<u64>(group) * sf_stride + row] = scale;
        }
    }
};

// One CTA of 256 threads per kBlock x kBlock block; grid (ceil(N/kBlock), ceil(K/kBlock)).
template <InputKind kKind, u32 kBlock>
struct QuantizePerBlock {
    static_assert(kBlock == 32 || kBlock == 64 || kBlock == 128, "block must be 32, 64 or 128");
    static constexpr u32 kNumWarps = 8;
    static constexpr u32 kRowsPerWarp = kBlock / kNumWarps;
    static constexpr u32 kColsPerLane = kBlock / 32;

    DG_DEVICE static void run(const void* w, u64 w_row_stride, u8* q, u64 q_row_stride, float* sf, u32 n, u32 k) {
        __shared__ float warp_amax[kNumWarps];
        ptx::programmatic_launch_sync();
        const u32 warp = threadIdx.x / 32;
        const u32 lane = threadIdx.x % 32;
        const u32 row0 = blockIdx.x * kBlock + warp * kRowsPerWarp;
        const u32 col0 = blockIdx.y * kBlock + lane;
        float values[kRowsPerWarp][kColsPerLane];
        float amax = 0.0f;
#pragma unroll
        for (u32 r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
            for (u32 c = 0; c < kColsPerLane; ++c) {
                const u32 row = row0 + r;
                const u32 col = col0 + c * 32;
                values[r][c] = (row < n && col < k) ? load_as_float<kKind>(w, row * w_row_stride + col) : 0.0f;
                amax = max_nan(amax, fabsf(values[r][c]));
            }
        }
        amax = warp_max(amax);
        if (lane == 0) {
            warp_amax[warp] = amax;
        }
        __syncthreads();
        amax = warp_amax[0];
#pragma unroll
        for (u32 i = 1; i < kNumWarps; ++i) {
            amax = max_nan(amax, warp_amax[i]);
        }
        const float scale = fp8_scale_for(amax);
#pragma unroll
        for (u32 r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
            for (u32 c = 0; c < kColsPerLane; ++c) {
                const u32 row = row0 + r;
                const u32 col = col0 + c * 32;
                if (row < n && col < k) {
                    q[row * q_row_stride + col] = to_e4m3(values[r][c] / scale);
                }
            }
        }
        if (threadIdx.x == 0) {
            sf[static_cast<u64>(blockIdx.x) * gridDim.y + blockIdx.y] = scale;
        }
    }
};

}  // namespace deepgemm
