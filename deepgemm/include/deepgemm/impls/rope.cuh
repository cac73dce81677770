// Rotary position embedding of q and k in one launch, with the cos / sin of each token gathered by its position:
//   cache [P, R] holds cos(theta_0 .. theta_{R/2-1}) then sin(...) per position; the first R (rotary_dim) features
//   of every head rotate, pair p by theta_p; features R .. D pass through (copied when the output is another tensor).
//   pairs: (x[p], x[p + R/2]) (kInterleaved false: GPT-NeoX / Llama) or (x[2p], x[2p + 1]) (true: GPT-J / DeepSeek).
//   x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin in float32, rounded to the element type. sin_sign -1 rotates the
//   other way (the backward). A position outside [0, P) reads no cache row and makes its rotated features NaN.
//
// Rows are (token, head) pairs of q, then of k; kLanesPerRow lanes share a row (a power of two up to 32, so a warp
// holds 32 / kLanesPerRow rows), each lane taking kPairs pairs per step: on the vectorized path a 16-byte vector of
// each half (non-interleaved) or two vectors of adjacent pairs (interleaved).
#pragma once
#include <deepgemm/elementwise/elements.cuh>
#include <deepgemm/ptx/sync.cuh>

namespace deepgemm {

// One operand (q or k): in / out [tokens, heads, head_dim] with element strides; out may equal in (in place).
struct RopeOperand {
    const void* in;
    void* out;
    u64 in_token_stride, in_head_stride, out_token_stride, out_head_stride;
    u32 heads, head_dim;
};

template <InputKind kKind, InputKind kCacheKind, bool kInterleaved, bool kVectorized, bool kPositions64,
          u32 kLanesPerRow>
struct Rope {
    static_assert(kLanesPerRow >= 1 && kLanesPerRow <= 32 && (kLanesPerRow & (kLanesPerRow - 1)) == 0,
                  "lanes per row: a power of two up to 32");
    static constexpr u32 kThreads = 256;
    static constexpr u32 kRowsPerCta = kThreads / kLanesPerRow;
    static constexpr u32 kVec = kVectorized ? kVectorElements<kKind> : 1;
    static constexpr u32 kPairs = kVec;  // pairs per lane step
    static constexpr u32 kBytes = kElementBytes<kKind>;

    DG_DEVICE static void run(const RopeOperand& q, const RopeOperand& k, const void* cache, u64 cache_stride,
                              const void* positions, u32 tokens, u64 num_positions, u32 rotary_dim, float sin_sign) {
        ptx::programmatic_launch_sync();
        const u64 row = static_cast<u64>(blockIdx.x) * kRowsPerCta + threadIdx.x / kLanesPerRow;
        const u32 lane = threadIdx.x % kLanesPerRow;
        const u64 q_rows = static_cast<u64>(tokens) * q.heads;
        const u64 rows = q_rows + static_cast<u64>(tokens) * k.heads;
        if (row >= rows) return;
        const bool is_q = row < q_rows;
        const RopeOperand op = is_q ? q : k;  // a copy: selecting a reference would put both on the stack
        const u64 local = is_q ? row : row - q_rows;
        const u32 token = static_cast<u32>(local / op.heads), head = static_cast<u32>(local % op.heads);
        const u8* in = static_cast<const u8*>(op.in) + (token * op.in_token_stride + head * op.in_head_stride) * kBytes;
        u8* out = static_cast<u8*>(op.out) + (token * op.out_token_stride + head * op.out_head_stride) * kBytes;
        const i64 position = kPositions64 ? static_cast<const i64*>(positions)[token]
                                          : static_cast<const i32*>(positions)[token];
        const bool valid = position >= 0 && static_cast<u64>(position) < num_positions;
        const u8* cos_row = static_cast<const u8*>(cache) + (valid ? position : 0) * cache_stride * kElementBytes<kCacheKind>;
        const u32 half = rotary_dim / 2;
        for (u32 p = lane * kPairs; p < half; p += kLanesPerRow * kPairs) {
            rotate(in, out, cos_row, p, half, valid, sin_sign);
        }
        if (op.out != op.in) copy_tail(in, out, rotary_dim, op.head_dim, lane);
    }

    // Pairs p .. p + kPairs - 1 of one row.
    DG_DEVICE static void rotate(const u8* in, u8* out, const u8* cos_row, u32 p, u32 half, bool valid,
                                 float sin_sign) {
        float x1[kPairs], x2[kPairs], c[kPairs], s[kPairs];
#pragma unroll
        for (u32 i = 0; i < kPairs; ++i) {
            c[i] = valid ? load_as_float<kCacheKind>(cos_row, p + i) : quiet_nan();
            s[i] = valid ? sin_sign * load_as_float<kCacheKind>(cos_row, half + p + i) : quiet_nan();
        }
        if constexpr (kInterleaved) {
            float v[2 * kPairs];
            load_run<2 * kPairs>(in, 2 * p, v);
#pragma unroll
            for (u32 i = 0; i < kPairs; ++i) x1[i] = v[2 * i], x2[i] = v[2 * i + 1];
        } else {
            load_run<kPairs>(in, p, x1);
            load_run<kPairs>(in, p + half, x2);
        }
        float r1[kPairs], r2[kPairs];
#pragma unroll
        for (u32 i = 0; i < kPairs; ++i) {
            r1[i] = x1[i] * c[i] - x2[i] * s[i];
            r2[i] = x2[i] * c[i] + x1[i] * s[i];
        }
        if constexpr (kInterleaved) {
            float v[2 * kPairs];
#pragma unroll
            for (u32 i = 0; i < kPairs; ++i) v[2 * i] = r1[i], v[2 * i + 1] = r2[i];
            store_run<2 * kPairs>(out, 2 * p, v);
        } else {
            store_run<kPairs>(out, p, r1);
            store_run<kPairs>(out, p + half, r2);
        }
    }

    // kCount consecutive elements from `index` on: 16-byte vectors on the vectorized path, else one at a time.
    template <u32 kCount>
    DG_DEVICE static void load_run(const u8* row, u64 index, float* values) {
        if constexpr (kVectorized) {
#pragma unroll
            for (u32 v = 0; v < kCount / kVec; ++v) load_vector_as_float<kKind>(row + (index + v * kVec) * kBytes, values + v * kVec);
        } else {
#pragma unroll
            for (u32 i = 0; i < kCount; ++i) values[i] = load_as_float<kKind>(row, index + i);
        }
    }

    template <u32 kCount>
    DG_DEVICE static void store_run(u8* row, u64 index, const float* values) {
        if constexpr (kVectorized) {
#pragma unroll
            for (u32 v = 0; v < kCount / kVec; ++v) {
                *reinterpret_cast<uint4*>(row + (index + v * kVec) * kBytes) = pack_vector<kKind>(values + v * kVec);
            }
        } else {
#pragma unroll
            for (u32 i = 0; i < kCount; ++i) store_from_float<kKind>(row, index + i, values[i]);
        }
    }

    // Features rotary_dim .. head_dim copied unchanged (out of place only).
    DG_DEVICE static void copy_tail(const u8* in, u8* out, u32 rotary_dim, u32 head_dim, u32 lane) {
        for (u32 j = rotary_dim + lane * kVec; j < head_dim; j += kLanesPerRow * kVec) {
            if constexpr (kVectorized) {
                *reinterpret_cast<uint4*>(out + static_cast<u64>(j) * kBytes) =
                    *reinterpret_cast<const uint4*>(in + static_cast<u64>(j) * kBytes);
            } else if constexpr (kBytes == 4) {
                reinterpret_cast<u32*>(out)[j] = reinterpret_cast<const u32*>(in)[j];
            } else {
                reinterpret_cast<u16*>(out)[j] = reinterpret_cast<const u16*>(in)[j];
            }
        }
    }
};

}  // namespace deepgemm
