// A math warpgroup's output stores in the 1D2D GEMM: registers -> shared memory -> TMA store (clipped at the
// tensor's edges), one 64-row wave (and, with chunked stores, one column chunk) per TMA bulk group. Unless the
// stores are chunked each wave has a staging buffer of its own (Cfg::kStoreBuffers), so a tile's stores only
// wait for that buffer's store of a tile earlier.
#pragma once
#include <deepgemm/epilogue/store_fragment.cuh>

namespace deepgemm {

template <typename Cfg>
struct WaveStores {
    static constexpr u32 kBlockN = Cfg::kBlockN;
    static constexpr u32 kStoreN = Cfg::kStoreN;
    static constexpr u32 kNumWaves = Cfg::kNumWaves;
    using Store = typename Cfg::Store;

    u8* smem;
    const OutputDescriptors* tma_d;
    u32 count;  // stores issued so far (Store::count)

    DG_DEVICE static void zero(float (&values)[kBlockN / 2]) {
#pragma unroll
        for (u32 i = 0; i < kBlockN / 2; ++i) {
            values[i] = 0.0f;
        }
    }

    DG_DEVICE Store staging() const {
        return Store{smem + Cfg::kOffsetD + (threadIdx.x / 128 - 1) * Cfg::kDBytesPerWarpgroup, count};
    }

    // Every output store of a computed tile goes through put (one TMA bulk group each).
    DG_DEVICE void put(const float (&values)[kStoreN / 2], u32 to_col, u32 to_row) {
        Store store = staging();
        store.store(values, tma_d, to_col, to_row, threadIdx.x % 128, threadIdx.x / 128);
        count = store.count;
    }

    // A computed tile's waves that have rows, from registers. row0: the warpgroup's first row in the flattened
    // output; tile_row: the same within the group's `rows`.
    DG_DEVICE void put_tile(const float (&results)[kNumWaves][kBlockN / 2], u32 col0, u32 row0, u32 tile_row, u32 rows,
                            u32 math_wg, u32 first_row) {
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
            const u32 offset = Cfg::wave_row(w, math_wg) - first_row;
            if (w > 0 && tile_row + offset >= rows) {
                break;
            }
#pragma unroll
            for (u32 c = 0; c < Cfg::kStoreChunks; ++c) {
                const auto& chunk = *reinterpret_cast<const float(*)[kStoreN / 2]>(&results[w][c * kStoreN / 2]);
                put(chunk, col0 + c * kStoreN, row0 + offset);
            }
        }
    }
};

}  // namespace deepgemm
