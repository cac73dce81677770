// Row softmax over the last dimension, fused with a scale and an optional causal mask, and its backward:
//   forward:  y[r, j] = exp(s * x[r, j] - max) / sum_j exp(s * x[r, j] - max), masked columns giving 0;
//   backward: dx[r, j] = s * y[r, j] * (dy[r, j] - sum_j dy[r, j] * y[r, j]).
// float32 math, outputs rounded to the element type. Causal (x viewed as [..., sq, n]): row r is query i = r % sq,
// and column j is masked where j > i + n - sq (aligned to the bottom-right corner, as FlashAttention; the upper
// triangle when sq = n). A row with every column masked (i < sq - n) is all zeros. NaN and +-inf follow torch:
// a NaN or +inf in a row, or a row of -inf, makes the row NaN.
//
// kThreadsPerRow threads (a power of two, at most 1024) share a row; a CTA holds max(256, kThreadsPerRow) threads,
// so several short rows per CTA; a row longer than a CTA can hold spans a cluster of kClusterCtas CTAs, which
// combine their partial max / sum through distributed shared memory. Cached (kStreaming false): each thread loads
// kItems vectors of the row once, keeps them in registers and writes from them (one read, one write). Streaming
// (rows longer than a cluster can hold): an online max / sum pass, then a pass that reads the row again and writes
// (the second read mostly hits L2).
#pragma once
#include <deepgemm/elementwise/elements.cuh>
#include <deepgemm/ptx/cluster.cuh>

namespace deepgemm {

// Reduce one value over a row's threads: shuffles within a warp, shared memory across the row's warps, and with
// kClusterCtas > 1 (a row split over a cluster, one row per CTA) distributed shared memory across the cluster. Every
// thread of the CTA (and of the cluster) must call it: it may hold barriers.
template <u32 kThreadsPerRow, u32 kClusterCtas, bool kMax>
DG_DEVICE float row_reduce(float value, float* warp_values) {
    constexpr u32 kLanes = kThreadsPerRow < 32 ? kThreadsPerRow : 32;
#pragma unroll
    for (u32 offset = kLanes / 2; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xFFFFFFFFu, value, offset);
        value = kMax ? max_nan(value, other) : value + other;
    }
    if constexpr (kThreadsPerRow > 32) {
        constexpr u32 kWarps = kThreadsPerRow / 32;
        const u32 warp = threadIdx.x / 32;
        if (threadIdx.x % 32 == 0) warp_values[warp] = value;
        __syncthreads();
        const float* row_values = warp_values + (warp / kWarps) * kWarps;
        value = row_values[0];
#pragma unroll
        for (u32 w = 1; w < kWarps; ++w) value = kMax ? max_nan(value, row_values[w]) : value + row_values[w];
        __syncthreads();  // warp_values is reused by the next reduction
    }
    if constexpr (kClusterCtas > 1) {
        // Lane c of warp 0 fetches CTA c's value (kClusterCtas remote loads a CTA, not one a thread), warp 0
        // combines them and shares the result through shared memory.
        __shared__ float cta_value, cluster_value;
        if (threadIdx.x == 0) cta_value = value;
        ptx::cluster_sync();
        if (threadIdx.x < 32) {
            const u32 lane = threadIdx.x;
            float other = ptx::ld_shared_cluster(&cta_value, lane < kClusterCtas ? lane : 0);
#pragma unroll
            for (u32 offset = kClusterCtas / 2; offset > 0; offset /= 2) {
                const float shuffled = __shfl_xor_sync(0xFFFFFFFFu, other, offset);
                other = kMax ? max_nan(other, shuffled) : other + shuffled;
            }
            if (lane == 0) cluster_value = other;
        }
        ptx::cluster_sync();  // also: no CTA rewrites cta_value (or exits) while another reads it
        value = cluster_value;
    }
    return value;
}

// One row's vectors: kVec elements (a 16-byte vector, or one element on the scalar path) at a time.
template <InputKind kKind, bool kVectorized>
struct RowAccess {
    static constexpr u32 kVec = kVectorized ? kVectorElements<kKind> : 1;
    using Raw = uint4;  // the scalar path keeps its element's float bits in .x

    DG_DEVICE static Raw load(const void* row, u32 col) {
        if constexpr (kVectorized) {
            return *reinterpret_cast<const uint4*>(static_cast<const u8*>(row) + static_cast<u64>(col) * kElementBytes<kKind>);
        } else {
            return make_uint4(__float_as_uint(load_as_float<kKind>(row, col)), 0, 0, 0);
        }
    }

    DG_DEVICE static void unpack(const Raw& raw, float* out) {
        if constexpr (kVectorized) {
            unpack_vector<kKind>(raw, out);
        } else {
            out[0] = __uint_as_float(raw.x);
        }
    }

    DG_DEVICE static void store(void* row, u32 col, const float* values) {
        if constexpr (kVectorized) {
            *reinterpret_cast<uint4*>(static_cast<u8*>(row) + static_cast<u64>(col) * kElementBytes<kKind>) =
                pack_vector<kKind>(values);
        } else {
            store_from_float<kKind>(row, col, values[0]);
        }
    }
};

template <InputKind kKind, u32 kThreadsPerRow, u32 kItems, bool kVectorized, u32 kClusterCtas>
struct SoftmaxShape {
    static_assert(kThreadsPerRow >= 1 && kThreadsPerRow <= 1024 && (kThreadsPerRow & (kThreadsPerRow - 1)) == 0,
                  "threads per row: a power of two up to 1024");
    static_assert(kClusterCtas == 1 || kThreadsPerRow >= 256, "a row split over a cluster fills its CTAs");
    static constexpr u32 kCtaThreads = kThreadsPerRow > 256 ? kThreadsPerRow : 256;
    static constexpr u32 kRowsPerCta = kCtaThreads / kThreadsPerRow;
    using Access = RowAccess<kKind, kVectorized>;
    static constexpr u32 kVec = Access::kVec;
    static constexpr u32 kRowThreads = kThreadsPerRow * kClusterCtas;  // threads sharing a row
    static constexpr u32 kChunk = kRowThreads * kItems * kVec;        // columns one pass over the items covers

    // This thread's row, and its first column within a chunk (CTA c of a cluster takes the row's threads
    // c * kThreadsPerRow ..).
    // (A CTA of a kernel with kRowsInFlight rows a row group takes kRowsInFlight * kRowsPerCta consecutive rows;
    // this thread's j-th is row(j, kRowsInFlight).)
    DG_DEVICE static u64 row(u32 j = 0, u32 rows_in_flight = 1) {
        if constexpr (kClusterCtas > 1) return blockIdx.x / kClusterCtas;
        return (static_cast<u64>(blockIdx.x) * rows_in_flight + j) * kRowsPerCta + threadIdx.x / kThreadsPerRow;
    }
    DG_DEVICE static u32 column(u32 chunk_start, u32 item) {
        u32 thread = threadIdx.x % kThreadsPerRow;
        if constexpr (kClusterCtas > 1) thread += ptx::cluster_cta_rank() * kThreadsPerRow;
        return chunk_start + (item * kRowThreads + thread) * kVec;
    }
};

template <InputKind kKind, u32 kThreadsPerRow, u32 kItems, bool kVectorized, bool kCausal, bool kStreaming,
          u32 kClusterCtas = 1, u32 kRowsInFlight = 1>
struct SoftmaxForward : SoftmaxShape<kKind, kThreadsPerRow, kItems, kVectorized, kClusterCtas> {
    using Shape = SoftmaxShape<kKind, kThreadsPerRow, kItems, kVectorized, kClusterCtas>;
    using Access = typename Shape::Access;
    using Raw = typename Access::Raw;
    static constexpr u32 kVec = Shape::kVec;
    static constexpr float kLog2e = 1.4426950408889634f;
    // kRowsInFlight rows a row group on the cached path: every row's loads issue before the first row's reductions,
    // so they overlap them.
    static_assert(kRowsInFlight == 1 || (kClusterCtas == 1 && !kStreaming), "rows in flight: cached CTA rows only");

    struct Row {
        u64 index;    // the row (0 for an inactive thread, whose loads and stores are skipped)
        bool active;  // inactive threads still take part in the reductions
        u32 limit;    // columns [limit, n) are masked (all of them for an inactive thread)
    };

    DG_DEVICE static Row locate(u64 rows, u32 n, u32 sq, u64 r) {
        Row row{r < rows ? r : 0, r < rows, r < rows ? n : 0u};  // an inactive thread sees no column
        if constexpr (kCausal) {
            const i64 visible = static_cast<i64>(r % sq) + n - sq + 1;
            if (row.active) row.limit = visible <= 0 ? 0u : (visible >= n ? n : static_cast<u32>(visible));
        }
        return row;
    }

    DG_DEVICE static const u8* row_address(const void* base, u64 stride, const Row& row) {
        return static_cast<const u8*>(base) + row.index * stride * kElementBytes<kKind>;
    }

    // x [rows, n] (row stride x_stride elements) -> y (row stride y_stride); `scale` multiplies x before the softmax;
    // sq: the query rows of the causal mask (rows = batch * sq).
    DG_DEVICE static void run(const void* x, u64 x_stride, void* y, u64 y_stride, u64 rows, u32 n, float scale,
                              u32 sq) {
        __shared__ float warp_values[Shape::kCtaThreads / 32];
        ptx::programmatic_launch_sync();
        const float factor = scale * kLog2e;  // exp(s x - m) = 2^(s x log2(e) - m')
        if constexpr (kStreaming) {
            const Row row = locate(rows, n, sq, Shape::row());
            run_streaming(row_address(x, x_stride, row), const_cast<u8*>(row_address(y, y_stride, row)), row.active,
                          n, row.limit, factor, warp_values);
        } else {
            Row row[kRowsInFlight];
            Raw cache[kRowsInFlight][kItems];
#pragma unroll
            for (u32 j = 0; j < kRowsInFlight; ++j) {
                row[j] = locate(rows, n, sq, Shape::row(j, kRowsInFlight));
                const u8* x_row = row_address(x, x_stride, row[j]);
#pragma unroll
                for (u32 i = 0; i < kItems; ++i) {
                    const u32 col = Shape::column(0, i);
                    cache[j][i] = col < row[j].limit ? Access::load(x_row, col) : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (u32 j = 0; j < kRowsInFlight; ++j) {
                finish_cached(row[j], cache[j], const_cast<u8*>(row_address(y, y_stride, row[j])), n, factor,
                              warp_values);
            }
        }
    }

    // A cached row: max, sum of exponentials, then the stores from the registers.
    // f(t) for every cached value t = x * factor of an unmasked column.
    template <typename F>
    DG_DEVICE static void for_each_visible(const Raw* cache, u32 limit, float factor, F&& f) {
#pragma unroll
        for (u32 i = 0; i < kItems; ++i) {
            const u32 col = Shape::column(0, i);
            float values[kVec];
            Access::unpack(cache[i], values);
#pragma unroll
            for (u32 v = 0; v < kVec; ++v) {
                if (col + v < limit) f(values[v] * factor);
            }
        }
    }

    DG_DEVICE static void finish_cached(const Row& row, const Raw* cache, u8* y_row, u32 n, float factor,
                                        float* warp_values) {
        float row_max = negative_infinity();
        for_each_visible(cache, row.limit, factor, [&](float t) { row_max = max_nan(row_max, t); });
        row_max = row_reduce<kThreadsPerRow, kClusterCtas, true>(row_max, warp_values);
        float sum = 0.0f;
        for_each_visible(cache, row.limit, factor, [&](float t) { sum += exp2f(t - row_max); });
        sum = row_reduce<kThreadsPerRow, kClusterCtas, false>(sum, warp_values);
        const float inverse = 1.0f / sum;
        if (!row.active) return;
#pragma unroll
        for (u32 i = 0; i < kItems; ++i) {
            const u32 col = Shape::column(0, i);
            if (col >= n) continue;
            float values[kVec];
            Access::unpack(cache[i], values);
#pragma unroll
            for (u32 v = 0; v < kVec; ++v) {
                values[v] = col + v < row.limit ? exp2f(values[v] * factor - row_max) * inverse : 0.0f;
            }
            Access::store(y_row, col, values);
        }
    }

    DG_DEVICE static void run_streaming(const u8* x_row, u8* y_row, bool active, u32 n, u32 limit, float factor,
                                        float* warp_values) {
        // Online pass: a running max m and sum s of 2^(t - m), rescaled when m grows.
        float m = negative_infinity(), s = 0.0f;
        for (u32 start = 0; start < limit; start += Shape::kChunk) {
            typename Access::Raw cache[kItems];
#pragma unroll
            for (u32 i = 0; i < kItems; ++i) {
                const u32 col = Shape::column(start, i);
                cache[i] = active && col < limit ? Access::load(x_row, col) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (u32 i = 0; i < kItems; ++i) {
                const u32 col = Shape::column(start, i);
                float values[kVec];
                Access::unpack(cache[i], values);
#pragma unroll
                for (u32 v = 0; v < kVec; ++v) {
                    if (!(active && col + v < limit)) continue;
                    const float t = values[v] * factor;
                    if (t > m) {
                        s = s * exp2f(m - t) + 1.0f;
                        m = t;
                    } else if (t != negative_infinity()) {  // -inf adds 0 (exp2(-inf - -inf) would be NaN)
                        s += exp2f(t - m);                   // a NaN t makes the row NaN
                    }
                }
            }
        }
        const float row_max = row_reduce<kThreadsPerRow, kClusterCtas, true>(m, warp_values);
        // A thread that saw no finite column (m = -inf, s = 0) adds 0; a NaN max makes the row NaN, and so does a
        // row of -inf (sum 0: 0 * inf).
        const float sum = row_reduce<kThreadsPerRow, kClusterCtas, false>(s == 0.0f ? 0.0f : s * exp2f(m - row_max), warp_values);
        const float inverse = 1.0f / sum;
        if (!active) return;
        for (u32 start = 0; start < n; start += Shape::kChunk) {
            typename Access::Raw cache[kItems];
#pragma unroll
            for (u32 i = 0; i < kItems; ++i) {
                const u32 col = Shape::column(start, i);
                cache[i] = col < limit ? Access::load(x_row, col) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (u32 i = 0; i < kItems; ++i) {
                const u32 col = Shape::column(start, i);
                if (col >= n) continue;
                float values[kVec];
                Access::unpack(cache[i], values);
#pragma unroll
                for (u32 v = 0; v < kVec; ++v) {
                    values[v] = col + v < limit ? exp2f(values[v] * factor - row_max) * inverse : 0.0f;
                }
                Access::store(y_row, col, values);
            }
        }
    }
};

template <InputKind kKind, u32 kThreadsPerRow, u32 kItems, bool kVectorized, bool kStreaming, u32 kClusterCtas = 1>
struct SoftmaxBackward : SoftmaxShape<kKind, kThreadsPerRow, kItems, kVectorized, kClusterCtas> {
    using Shape = SoftmaxShape<kKind, kThreadsPerRow, kItems, kVectorized, kClusterCtas>;
    using Access = typename Shape::Access;
    static constexpr u32 kVec = Shape::kVec;

    // y, dy [rows, n] (row strides y_stride, dy_stride) -> dx (row stride dx_stride).
    DG_DEVICE static void run(const void* y, u64 y_stride, const void* dy, u64 dy_stride, void* dx, u64 dx_stride,
                              u64 rows, u32 n, float scale) {
        __shared__ float warp_values[Shape::kCtaThreads / 32];
        ptx::programmatic_launch_sync();
        const u64 r = Shape::row();
        const bool active = r < rows;
        const u64 row = active ? r : 0;
        const u8* y_row = static_cast<const u8*>(y) + row * y_stride * kElementBytes<kKind>;
        const u8* dy_row = static_cast<const u8*>(dy) + row * dy_stride * kElementBytes<kKind>;
        u8* dx_row = static_cast<u8*>(dx) + row * dx_stride * kElementBytes<kKind>;
        typename Access::Raw y_cache[kStreaming ? 1 : kItems] = {}, dy_cache[kStreaming ? 1 : kItems] = {};
        float dot = 0.0f;
        for (u32 start = 0; start < n; start += Shape::kChunk) {
#pragma unroll
            for (u32 i = 0; i < kItems; ++i) {
                const u32 col = Shape::column(start, i);
                typename Access::Raw& yr = y_cache[kStreaming ? 0 : i];
                typename Access::Raw& dyr = dy_cache[kStreaming ? 0 : i];
                if (!(active && col < n)) continue;
                yr = Access::load(y_row, col);
                dyr = Access::load(dy_row, col);
                float yv[kVec], dyv[kVec];
                Access::unpack(yr, yv);
                Access::unpack(dyr, dyv);
#pragma unroll
                for (u32 v = 0; v < kVec; ++v) dot += yv[v] * dyv[v];
            }
            if constexpr (!kStreaming) break;  // one chunk covers the row
        }
        dot = row_reduce<kThreadsPerRow, kClusterCtas, false>(dot, warp_values);
        if (!active) return;
        for (u32 start = 0; start < n; start += Shape::kChunk) {
#pragma unroll
            for (u32 i = 0; i < kItems; ++i) {
                const u32 col = Shape::column(start, i);
                if (col >= n) continue;
                typename Access::Raw yr, dyr;
                if constexpr (kStreaming) {
                    yr = Access::load(y_row, col);
                    dyr = Access::load(dy_row, col);
                } else {
                    yr = y_cache[i];
                    dyr = dy_cache[i];
                }
                float yv[kVec], dyv[kVec];
                Access::unpack(yr, yv);
                Access::unpack(dyr, dyv);
#pragma unroll
                for (u32 v = 0; v < kVec; ++v) yv[v] = scale * yv[v] * (dyv[v] - dot);
                Access::store(dx_row, col, yv);
            }
            if constexpr (!kStreaming) break;
        }
    }
};

}  // namespace deepgemm
