// One-pass FP8 (e4m3) quantization kernels producing the scale layouts the FP8 GEMM reads.
//   per-token-group: x [M,K] -> q [M,K] e4m3, sf[g, m] = amax(x[m, g*G : (g+1)*G]) / 448 stored M-major
//                    (element (m, g) at sf + g * sf_stride + m; sf_stride = M rounded up to 4).
//   per-block:       w [N,K] -> q [N,K] e4m3, sf[nb, kb] = amax of the B x B block / 448, row-major; optionally
//                    also q^T [K,N] (the transposed weight an FP8 Dgrad reads).
//   gated (kSiluMul): x [M, 2K] holds [gate | up]; the quantized values are silu(gate) * up in float32
//                    (no rounding in between), a fused MLP activation, with the per-token-group layout above.
//   transposed:      x [T, C] -> q [C, T_out] e4m3 quantized per 1x128 group along T (the per-token-group result
//                    of x^T without the transposed copy: Wgrad operands), tokens T..T_out written as zeros;
//                    optionally also x's own per-token-group result in the same pass (both operands of a step).
// The scale is max(amax / 448, FLT_MIN): an all-zero group gets a tiny positive scale and zeros, never
// NaN or Inf. q = x / scale (bit-identical to IEEE division: FusedQuotient), rounded to nearest-even and
// saturated to +-448. A NaN in a group makes its scale (and q) NaN, matching the CPU reference.
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

// x / scale as an IEEE division (any scale).
struct DividedQuotient {
    float scale;
    DG_DEVICE float operator()(float x) const { return x / scale; }
};

// x / scale, bit-identical to the IEEE division, in three FMA-pipe instructions instead of a reciprocal, a range
// check and a branch per value. With inverse = RN(1/scale) (one division per group), q0 = RN(x * inverse) is within
// an ulp of x / scale, so the remainder x - scale * q0 is exact in an FMA and RN(q0 + inverse * remainder) is the
// correctly rounded quotient (Markstein's theorem). It needs remainders above the subnormal range: true for scale in
// [2^-90, 2^120] and |x / scale| <= 448 wherever |x| >= 2^-102; smaller x give quotients below 2^-12, which round
// to a zero of x's sign in e4m3 either way. The remainder is negated (fma(scale, q0, -x)) so that x = -0 gives -0.
// tests/cpu/test_quantize_cpu.py replays the sequence in exact arithmetic against the division.
struct FusedQuotient {
    float scale, inverse;
    DG_DEVICE float operator()(float x) const {
        const float q0 = __fmul_rn(x, inverse);
        return __fmaf_rn(-__fmaf_rn(scale, q0, -x), inverse, q0);
    }
};

// Whether the fused quotient is exact for this scale: every finite scale of a group with amax >= 448 * 2^-90.
// Else (an all-zero group's FLT_MIN scale, NaN, Inf) the division is used: one branch per group. Each kernel
// instantiates its store for both quotient types (template functions: NVRTC 13.0 rejects generic lambdas).
DG_DEVICE bool fused_quotient_applies(float scale) {
    return scale >= 0x1p-90f && scale <= 0x1p120f;
}

DG_DEVICE FusedQuotient fused_quotient(float scale) {
    return FusedQuotient{scale, 1.0f / scale};
}

DG_DEVICE u8 to_e4m3(float value) {
    return static_cast<u8>(ptx::pack_e4m3x2(value, 0.0f) & 0xFF);
}

// Four quotients as e4m3 bytes in one word (the first in the lowest byte).
template <typename Quotient>
DG_DEVICE u32 e4m3_word(const float* values, Quotient divide) {
    return static_cast<u32>(ptx::pack_e4m3x2(divide(values[0]), divide(values[1]))) |
           (static_cast<u32>(ptx::pack_e4m3x2(divide(values[2]), divide(values[3]))) << 16);
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

    // The lane's vectors of its group as e4m3 (4 or 8 bytes per store).
    template <typename Quotient>
    DG_DEVICE static void store_vectors(const float (&values)[kVecsPerLane][kVec], Quotient divide, u8* q,
                                        u64 q_row_stride, u32 row, u32 group, u32 sub, u32 k, bool valid) {
#pragma unroll
        for (u32 v = 0; v < kVecsPerLane; ++v) {
            const u32 col = group * kGroupSize + (v * kLanes + sub) * kVec;
            if (valid && col < k) {
                u32 words[kVec / 4];
#pragma unroll
                for (u32 w = 0; w < kVec / 4; ++w) {
                    words[w] = e4m3_word(values[v] + 4 * w, divide);
                }
                u8* target = q + row * q_row_stride + col;
                if constexpr (kVec == 8) {
                    *reinterpret_cast<uint2*>(target) = make_uint2(words[0], words[1]);
                } else {
                    *reinterpret_cast<u32*>(target) = words[0];
                }
            }
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
        if (fused_quotient_applies(scale)) {
            store_vectors(values, fused_quotient(scale), q, q_row_stride, row, group, sub, k, valid);
        } else {
            store_vectors(values, DividedQuotient{scale}, q, q_row_stride, row, group, sub, k, valid);
        }
        if (valid && sub == 0) {
            sf[static_cast<u64>(group) * sf_stride + row] = scale;
        }
    }

    // The lane's values of its group (columns lane, lane + 32, ...) as e4m3 bytes.
    template <typename Quotient>
    DG_DEVICE static void store_scalars(const float (&values)[kPerLane], Quotient divide, u8* q, u64 q_row_stride,
                                        u32 row, u32 group, u32 lane, u32 k) {
#pragma unroll
        for (u32 i = 0; i < kPerLane; ++i) {
            const u32 col = group * kGroupSize + i * 32 + lane;
            if (col < k) {
                q[row * q_row_stride + col] = to_e4m3(divide(values[i]));
            }
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
        if (fused_quotient_applies(scale)) {
            store_scalars(values, fused_quotient(scale), q, q_row_stride, row, group, lane, k);
        } else {
            store_scalars(values, DividedQuotient{scale}, q, q_row_stride, row, group, lane, k);
        }
        if (lane == 0) {
            sf[static_cast<u64>(group) * sf_stride + row] = scale;
        }
    }
};

// One CTA of 256 threads per kBlock x kBlock block. kKFastest (the host's choice wherever N has at most 65535 blocks,
// CUDA's grid y limit): grid (K blocks, N blocks), so the CTAs resident at once cover whole rows of w; else grid
// (N blocks, K blocks), which reads one column strip of every row at a time (rows 32 KB apart at K = 16384 BF16:
// 0.5-1 TB/s). kTransposed: also writes qt [K, N] = q^T (row stride qt_row_stride), the same bytes transposed
// through shared memory, and sft = sf^T (row-major [ceil(K/kBlock), ceil(N/kBlock)]): the FP8 training linear's
// Dgrad operand (W^T per block) with its scales, with no second pass over w.
// Two load paths with bit-identical results, each its own instantiation (in one kernel, the scalar path's 64 live
// addresses set the register count of both):
//   kVectorized (the host's choice where w's base and rows are 16-byte aligned and K is a whole number of vectors;
//     kCanVectorize: every block size but 32 with 16-bit input): kLanesPerRow lanes per block row, each loading
//     16-byte vectors and storing 4 / 8 e4m3 bytes at once;
//   scalar (any layout): lane l handles columns l, l + 32, ... of its warp's rows.
template <InputKind kKind, u32 kBlock, bool kTransposed, bool kKFastest, bool kVectorized>
struct QuantizePerBlock {
    static_assert(kBlock == 32 || kBlock == 64 || kBlock == 128, "block must be 32, 64 or 128");
    static constexpr u32 kNumWarps = 8;
    static constexpr u32 kRowsPerWarp = kBlock / kNumWarps;
    static constexpr u32 kColsPerLane = kBlock / 32;
    static constexpr u32 kTilePitch = kBlock + 4;  // bytes per staged row (kTransposed; a multiple of 4)
    static constexpr u32 kInputBytes = kKind == InputKind::kFloat32 ? 4 : 2;
    static constexpr u32 kVec = 16 / kInputBytes;
    static constexpr u32 kLanesPerRow = kBlock / kVec;        // (4 to 32)
    static constexpr u32 kRowsPerLoad = 32 / kLanesPerRow;    // rows one warp-wide vector load covers
    static constexpr bool kCanVectorize = kRowsPerWarp % kRowsPerLoad == 0;
    static_assert(kCanVectorize || !kVectorized, "16-bit input with block 32 has no vectorized layout");
    static constexpr u32 kLoads = kCanVectorize ? kRowsPerWarp / kRowsPerLoad : 1;

    // The warp's values as e4m3 bytes into q (inside [n, k]) and, kTransposed, into the staged tile (scalar layout).
    template <typename Quotient>
    DG_DEVICE static void store_block(const float (&values)[kRowsPerWarp][kColsPerLane], Quotient divide, u8* q,
                                      u64 q_row_stride, u32 n, u32 k, u32 row0, u32 col0, u32 warp, u32 lane, u8* tile) {
#pragma unroll
        for (u32 r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
            for (u32 c = 0; c < kColsPerLane; ++c) {
                const u32 row = row0 + r;
                const u32 col = col0 + c * 32;
                const u8 byte = to_e4m3(divide(values[r][c]));
                if (row < n && col < k) {
                    q[row * q_row_stride + col] = byte;
                }
                if constexpr (kTransposed) {
                    tile[(warp * kRowsPerWarp + r) * kTilePitch + lane + c * 32] = byte;
                }
            }
        }
    }

    // The same for the vectorized layout: value e of load l is row row0 + l * kRowsPerLoad, column col0 + e.
    template <typename Quotient>
    DG_DEVICE static void store_vectors(const float (&values)[kLoads][kVec], Quotient divide, u8* q, u64 q_row_stride,
                                        u32 n, u32 k, u32 row0, u32 col0, u32 tile_row0, u32 tile_col0, u8* tile) {
#pragma unroll
        for (u32 l = 0; l < kLoads; ++l) {
            u32 words[kVec / 4];
#pragma unroll
            for (u32 w = 0; w < kVec / 4; ++w) {
                words[w] = e4m3_word(values[l] + 4 * w, divide);
            }
            const u32 row = row0 + l * kRowsPerLoad;
            if (row < n && col0 < k) {  // (K is a whole number of vectors: the vector is all inside or all out)
                u8* target = q + row * q_row_stride + col0;
                if constexpr (kVec == 8) {
                    *reinterpret_cast<uint2*>(target) = make_uint2(words[0], words[1]);
                } else {
                    *reinterpret_cast<u32*>(target) = words[0];
                }
            }
            if constexpr (kTransposed) {
                u32* staged = reinterpret_cast<u32*>(tile + (tile_row0 + l * kRowsPerLoad) * kTilePitch + tile_col0);
#pragma unroll
                for (u32 w = 0; w < kVec / 4; ++w) {
                    staged[w] = words[w];
                }
            }
        }
    }

    // The block's scale from every thread's amax (all threads of the CTA call it).
    DG_DEVICE static float block_scale(float amax, float* warp_amax, u32 warp, u32 lane) {
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
        return fp8_scale_for(amax);
    }

    DG_DEVICE static void run(const void* w, u64 w_row_stride, u8* q, u64 q_row_stride, float* sf, u32 n, u32 k,
                              u8* qt = nullptr, u64 qt_row_stride = 0, float* sft = nullptr) {
        __shared__ float warp_amax[kNumWarps];
        __shared__ alignas(16) u8 tile[kTransposed ? kBlock * kTilePitch : 4];
        ptx::programmatic_launch_sync();
        const u32 n_block = kKFastest ? blockIdx.y : blockIdx.x;
        const u32 k_block = kKFastest ? blockIdx.x : blockIdx.y;
        const u32 n_blocks = kKFastest ? gridDim.y : gridDim.x;
        const u32 k_blocks = kKFastest ? gridDim.x : gridDim.y;
        const u32 warp = threadIdx.x / 32;
        const u32 lane = threadIdx.x % 32;
        float scale;
        if constexpr (kVectorized) {
            scale = quantize_vectorized(w, w_row_stride, q, q_row_stride, n, k, n_block, k_block, warp, lane,
                                        warp_amax, tile);
        } else {
            scale = quantize_scalar(w, w_row_stride, q, q_row_stride, n, k, n_block, k_block, warp, lane, warp_amax,
                                    tile);
        }
        if (threadIdx.x == 0) {
            sf[static_cast<u64>(n_block) * k_blocks + k_block] = scale;
            if constexpr (kTransposed) {
                sft[static_cast<u64>(k_block) * n_blocks + n_block] = scale;
            }
        }
        if constexpr (kTransposed) {
            __syncthreads();
            store_transposed(tile, qt, qt_row_stride, n, k, n_block, k_block);
        }
    }

    DG_DEVICE static float quantize_scalar(const void* w, u64 w_row_stride, u8* q, u64 q_row_stride, u32 n, u32 k,
                                           u32 n_block, u32 k_block, u32 warp, u32 lane, float* warp_amax, u8* tile) {
        const u32 row0 = n_block * kBlock + warp * kRowsPerWarp;
        const u32 col0 = k_block * kBlock + lane;
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
        const float scale = block_scale(amax, warp_amax, warp, lane);
        if (fused_quotient_applies(scale)) {
            store_block(values, fused_quotient(scale), q, q_row_stride, n, k, row0, col0, warp, lane, tile);
        } else {
            store_block(values, DividedQuotient{scale}, q, q_row_stride, n, k, row0, col0, warp, lane, tile);
        }
        return scale;
    }

    DG_DEVICE static float quantize_vectorized(const void* w, u64 w_row_stride, u8* q, u64 q_row_stride, u32 n, u32 k,
                                               u32 n_block, u32 k_block, u32 warp, u32 lane, float* warp_amax,
                                               u8* tile) {
        const u32 tile_row0 = warp * kRowsPerWarp + lane / kLanesPerRow;
        const u32 tile_col0 = lane % kLanesPerRow * kVec;
        const u32 row0 = n_block * kBlock + tile_row0;
        const u32 col0 = k_block * kBlock + tile_col0;
        float values[kLoads][kVec];
        float amax = 0.0f;
#pragma unroll
        for (u32 l = 0; l < kLoads; ++l) {
            const u32 row = row0 + l * kRowsPerLoad;
            if (row < n && col0 < k) {
                load_vector_as_float<kKind>(static_cast<const u8*>(w) + (row * w_row_stride + col0) * kInputBytes,
                                            values[l]);
            } else {
#pragma unroll
                for (u32 e = 0; e < kVec; ++e) values[l][e] = 0.0f;
            }
#pragma unroll
            for (u32 e = 0; e < kVec; ++e) amax = max_nan(amax, fabsf(values[l][e]));
        }
        const float scale = block_scale(amax, warp_amax, warp, lane);
        if (fused_quotient_applies(scale)) {
            store_vectors(values, fused_quotient(scale), q, q_row_stride, n, k, row0, col0, tile_row0, tile_col0, tile);
        } else {
            store_vectors(values, DividedQuotient{scale}, q, q_row_stride, n, k, row0, col0, tile_row0, tile_col0, tile);
        }
        return scale;
    }

    // qt row j (column k_block * kBlock + j of w) gets the block's column j: 16-byte pieces of staged bytes.
    DG_DEVICE static void store_transposed(const u8* tile, u8* qt, u64 qt_row_stride, u32 n, u32 k, u32 n_block,
                                           u32 k_block) {
        constexpr u32 kPiecesPerRow = kBlock / 16;
        const u32 n0 = n_block * kBlock, k0 = k_block * kBlock;
        for (u32 p = threadIdx.x; p < kBlock * kPiecesPerRow; p += kNumWarps * 32) {
            const u32 j = p / kPiecesPerRow, i0 = (p % kPiecesPerRow) * 16;
            if (k0 + j >= k || n0 + i0 >= n) {
                continue;
            }
            u8* target = qt + static_cast<u64>(k0 + j) * qt_row_stride + n0 + i0;
            if (n0 + i0 + 16 <= n && qt_row_stride % 16 == 0) {  // (qt's base is a fresh, aligned block)
                u32 words[4];
#pragma unroll
                for (u32 w = 0; w < 4; ++w) {
                    words[w] = 0;
#pragma unroll
                    for (u32 e = 0; e < 4; ++e) {
                        words[w] |= static_cast<u32>(tile[(i0 + 4 * w + e) * kTilePitch + j]) << (8 * e);
                    }
                }
                *reinterpret_cast<uint4*>(target) = make_uint4(words[0], words[1], words[2], words[3]);
            } else {
                for (u32 e = 0; e < 16 && n0 + i0 + e < n; ++e) {
                    target[e] = tile[(i0 + e) * kTilePitch + j];
                }
            }
        }
    }
};

// Transposed per-token-group: x [T, C] (unit column stride) -> qt [C, t_out] per 1x128 group along T, sft[g, c]
// M-major over C (element (c, g) at sft + g * sft_stride + c); tokens t..t_out are zeros (a padded Wgrad operand).
// kRowsToo: the same pass also writes the per-token-group result of x itself, q [T, C] with sf M-major over T (what
// quantize_per_token_group(x) gives), so an FP8 training step reads its activations and gradients once for both.
// One 256-thread CTA per 128-token x kCols-column tile (kCols 64, or 128 = one row group with kRowsToo): the tile's
// rows are read coalesced (16-byte vectors where x allows) into shared memory as raw elements (a row pitch of one
// 4-byte word over the row: conflict-free down the columns; 34 KB with kRowsToo in 16 bits, so 6 CTAs per SM), then
// each column is quantized by kParts threads of 128 / kParts tokens, and with kRowsToo each row by two threads of 64
// columns; every thread stores whole 16-byte pieces where the row allows.
template <u32 kBytes>
struct RawElement {
    using Type = u16;
};
template <>
struct RawElement<4> {
    using Type = u32;
};

template <InputKind kKind, bool kRowsToo = false>
struct QuantizeTransposed {
    static constexpr u32 kTokens = 128;  // one scale group per tile
    static constexpr u32 kCols = kRowsToo ? 128 : 64;
    static constexpr u32 kThreads = 256;
    static constexpr u32 kParts = kThreads / kCols;
    static constexpr u32 kTokensPerPart = kTokens / kParts;
    static constexpr u32 kInputBytes = kKind == InputKind::kFloat32 ? 4 : 2;
    using Raw = typename RawElement<kInputBytes>::Type;  // staged bits: u32 (float32) or u16
    static constexpr u32 kPitch = kCols + 4 / kInputBytes;  // elements per staged row
    static constexpr u32 kColsPerRowThread = kCols / (kThreads / kTokens);  // kRowsToo: 64
    static constexpr u32 kTileBytes = kTokens * kPitch * kInputBytes;
    static constexpr u32 kSmemBytes = kTileBytes + kParts * kCols * 4;
    static constexpr u32 kVec = 16 / kInputBytes;
    static_assert(kTokensPerPart % 16 == 0 && kColsPerRowThread % 16 == 0, "whole 16-byte pieces per thread");
    static_assert(kTileBytes % 16 == 0, "the column maxima follow the tile, aligned");

    DG_DEVICE static float staged(const Raw* tile, u32 row, u32 col) {
        return load_as_float<kKind>(tile, row * kPitch + col);
    }

    DG_DEVICE static void load_tile(const void* x, u64 x_row_stride, u32 t, u32 c, u32 t0, u32 c0, u32 vectorized,
                                    Raw* tile) {
        if (vectorized) {  // the host checked: x's base and rows 16-byte aligned, C a whole number of vectors
            constexpr u32 kVecsPerRow = kCols / kVec;
            for (u32 i = threadIdx.x; i < kTokens * kVecsPerRow; i += kThreads) {
                const u32 row = i / kVecsPerRow, col = (i % kVecsPerRow) * kVec;
                uint4 raw = make_uint4(0, 0, 0, 0);  // (zero bits: +0 in every element type)
                if (t0 + row < t && c0 + col < c) {
                    const u64 index = static_cast<u64>(t0 + row) * x_row_stride + c0 + col;
                    raw = *reinterpret_cast<const uint4*>(static_cast<const u8*>(x) + index * kInputBytes);
                }
                const u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (u32 e = 0; e < kVec; ++e) {
                    tile[row * kPitch + col + e] =
                        static_cast<Raw>(kInputBytes == 4 ? words[e] : words[e / 2] >> (16 * (e % 2)));
                }
            }
        } else {
            for (u32 i = threadIdx.x; i < kTokens * kCols; i += kThreads) {
                const u32 row = i / kCols, col = i % kCols;
                const bool inside = t0 + row < t && c0 + col < c;
                tile[row * kPitch + col] =
                    inside ? static_cast<const Raw*>(x)[static_cast<u64>(t0 + row) * x_row_stride + c0 + col] : Raw(0);
            }
        }
    }

    // kCount staged values from (row, col) stepping (dr, dc), quantized with `scale` and stored at `target` (those
    // before the row's `limit`): 16-byte pieces where the whole run is in range and the row stride keeps them
    // aligned, else byte by byte. The values are read again from shared memory rather than held in registers.
    template <u32 kCount>
    DG_DEVICE static void store_quantized(const Raw* tile, u32 row, u32 col, u32 dr, u32 dc, float scale, u8* target,
                                          u32 first, u32 limit, u64 row_stride) {
        if (fused_quotient_applies(scale)) {
            store_quantized<kCount>(tile, row, col, dr, dc, fused_quotient(scale), target, first, limit, row_stride);
        } else {
            store_quantized<kCount>(tile, row, col, dr, dc, DividedQuotient{scale}, target, first, limit, row_stride);
        }
    }

    template <u32 kCount, typename Quotient>
    DG_DEVICE static void store_quantized(const Raw* tile, u32 row, u32 col, u32 dr, u32 dc, Quotient divide,
                                          u8* target, u32 first, u32 limit, u64 row_stride) {
        if (first + kCount <= limit && row_stride % 16 == 0) {  // (the outputs' bases are fresh, aligned blocks)
#pragma unroll
            for (u32 piece = 0; piece < kCount / 16; ++piece) {
                u32 words[4];
#pragma unroll
                for (u32 w = 0; w < 4; ++w) {
                    float f[4];
#pragma unroll
                    for (u32 e = 0; e < 4; ++e) {
                        const u32 i = piece * 16 + 4 * w + e;
                        f[e] = divide(staged(tile, row + i * dr, col + i * dc));
                    }
                    words[w] = static_cast<u32>(ptx::pack_e4m3x2(f[0], f[1])) |
                               (static_cast<u32>(ptx::pack_e4m3x2(f[2], f[3])) << 16);
                }
                *reinterpret_cast<uint4*>(target + piece * 16) = make_uint4(words[0], words[1], words[2], words[3]);
            }
        } else {
            for (u32 i = 0; i < kCount && first + i < limit; ++i) {
                target[i] = to_e4m3(divide(staged(tile, row + i * dr, col + i * dc)));
            }
        }
    }

    // The largest |value| of kCount staged values from (row, col) stepping (dr, dc) (NaN-propagating).
    template <u32 kCount>
    DG_DEVICE static float staged_amax(const Raw* tile, u32 row, u32 col, u32 dr, u32 dc) {
        float amax = 0.0f;
#pragma unroll 16
        for (u32 i = 0; i < kCount; ++i) amax = max_nan(amax, fabsf(staged(tile, row + i * dr, col + i * dc)));
        return amax;
    }

    DG_DEVICE static void quantize_columns(const Raw* tile, float* part_amax, u32 c, u32 c0, u8* qt,
                                           u64 qt_row_stride, u32 t_out, float* sft, u32 sft_stride) {
        const u32 col = threadIdx.x % kCols, part = threadIdx.x / kCols;  // a warp: 32 adjacent columns
        const u32 row = part * kTokensPerPart;
        part_amax[part * kCols + col] = staged_amax<kTokensPerPart>(tile, row, col, 1, 0);
        __syncthreads();
        float amax = part_amax[col];
#pragma unroll
        for (u32 p = 1; p < kParts; ++p) amax = max_nan(amax, part_amax[p * kCols + col]);
        const float scale = fp8_scale_for(amax);
        if (c0 + col >= c) {
            return;
        }
        const u32 token = blockIdx.x * kTokens + row;
        store_quantized<kTokensPerPart>(tile, row, col, 1, 0, scale,
                                        qt + static_cast<u64>(c0 + col) * qt_row_stride + token, token, t_out,
                                        qt_row_stride);
        if (part == 0) {
            sft[static_cast<u64>(blockIdx.x) * sft_stride + c0 + col] = scale;
        }
    }

    // kRowsToo: row r of the tile is token t0 + r's whole 128-column group; threads 2r and 2r + 1 take 64 columns each.
    DG_DEVICE static void quantize_rows(const Raw* tile, u32 t, u32 c, u32 t0, u32 c0, u8* q, u64 q_row_stride,
                                        float* sf, u32 sf_stride) {
        const u32 row = threadIdx.x / 2, half = threadIdx.x % 2, col = half * kColsPerRowThread;
        float amax = staged_amax<kColsPerRowThread>(tile, row, col, 0, 1);
        amax = max_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
        const float scale = fp8_scale_for(amax);
        const u32 first = c0 + col;
        if (t0 + row < t && first < c) {  // (no early return: quantize_columns synchronizes the CTA next)
            store_quantized<kColsPerRowThread>(tile, row, col, 0, 1, scale,
                                               q + static_cast<u64>(t0 + row) * q_row_stride + first, first, c,
                                               q_row_stride);
        }
        if (t0 + row < t && half == 0) {
            sf[static_cast<u64>(blockIdx.y) * sf_stride + t0 + row] = scale;
        }
    }

    DG_DEVICE static void run(const void* x, u64 x_row_stride, u32 t, u32 c, u8* qt, u64 qt_row_stride, u32 t_out,
                              float* sft, u32 sft_stride, u32 vectorized, u8* q, u64 q_row_stride, float* sf,
                              u32 sf_stride) {
        extern __shared__ __align__(16) u8 smem[];
        Raw* tile = reinterpret_cast<Raw*>(smem);
        float* part_amax = reinterpret_cast<float*>(smem + kTileBytes);
        ptx::programmatic_launch_sync();
        const u32 t0 = blockIdx.x * kTokens, c0 = blockIdx.y * kCols;
        load_tile(x, x_row_stride, t, c, t0, c0, vectorized, tile);
        __syncthreads();
        if constexpr (kRowsToo) {
            quantize_rows(tile, t, c, t0, c0, q, q_row_stride, sf, sf_stride);
        }
        quantize_columns(tile, part_amax, c, c0, qt, qt_row_stride, t_out, sft, sft_stride);
    }
};

}  // namespace deepgemm
