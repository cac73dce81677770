// A math warpgroup's output stores in the 1D2D GEMM: registers -> shared memory -> TMA store (clipped at the
// tensor's edges), one 64-row wave (and, with chunked stores, one column chunk) per TMA bulk group.
//
// Overlapped stores (Cfg::kOverlapStores): once a wave is promoted for the last time it is packed to BF16
// pairs (half the registers) and stored right after the next MMAs are issued - wave w - 1 after the last
// K block's wave-w MMAs, the tile's last wave after the next tile's first MMAs (until then it is "pending").
// The first K block of a tile sets the results instead of adding to them, so no register is zeroed or kept
// for the next tile. Inside the K loop the accumulators take most registers: so besides the packed wave only
// the store count, the tile slot in use and a pending flag are kept, and the rest (staging buffer, the
// thread's place, where the tile goes) is derived at the store from threadIdx and the tile slot. A tile's
// slot stays held until its last wave is stored.
#pragma once
#include <deepgemm/epilogue/store_fragment.cuh>
#include <deepgemm/mainloop/sm90_fp8_1d2d_tile_loader.cuh>

namespace deepgemm {

template <typename Cfg>
struct WaveStores {
    static constexpr u32 kBlockN = Cfg::kBlockN;
    static constexpr u32 kStoreN = Cfg::kStoreN;
    static constexpr u32 kNumWaves = Cfg::kNumWaves;
    static constexpr bool kOverlapStores = Cfg::kOverlapStores;
    using Store = typename Cfg::Store;

    u8* smem;
    const OutputDescriptors* tma_d;
    u32 count;     // stores issued so far (Store::count)
    u32 use;       // the current tile's slot use (kOverlapStores)
    bool pending;  // `packed` holds the last wave of the previous tile (slot use - 1, still held)
    u32 packed[kOverlapStores ? kBlockN / 4 : 1];  // a wave's BF16 pairs, waiting for its store

    DG_DEVICE static constexpr u32 wave_offset(u32 wave) { return wave * Cfg::kNumMathWarpgroups * 64; }

    DG_DEVICE static void zero(float (&values)[kBlockN / 2]) {
#pragma unroll
        for (u32 i = 0; i < kBlockN / 2; ++i) {
            values[i] = 0.0f;
        }
    }

    DG_DEVICE Store staging() const {
        return Store{smem + Cfg::kOffsetD + (threadIdx.x / 128 - 1) * Cfg::kDBytesPerWarpgroup, count};
    }

    // Every output store of a computed tile goes through put or put_packed (one TMA bulk group each).
    DG_DEVICE void put(const float (&values)[kStoreN / 2], u32 to_col, u32 to_row) {
        Store store = staging();
        store.store(values, tma_d, to_col, to_row, threadIdx.x % 128, threadIdx.x / 128);
        count = store.count;
    }

    // `packed` as wave `wave` of the tile in slot use `tile_use`.
    DG_DEVICE void put_packed(u32 tile_use, u32 wave) {
        if constexpr (kOverlapStores) {
            const GroupedTile& tile = TileSlots<Cfg>{smem}.slot(tile_use)->tile;
            const u32 first_row = Cfg::wave_row(0, threadIdx.x / 128 - 1);
            Store store = staging();
            store.store_bf16(packed, tma_d, tile.n_block * Cfg::kBlockN,
                             tile.row_begin + tile.m_block * Cfg::kBlockM + first_row + wave_offset(wave), threadIdx.x % 128,
                             threadIdx.x / 128);
            count = store.count;
        }
    }

    DG_DEVICE void pack(const float (&values)[kBlockN / 2]) {
        if constexpr (kOverlapStores) {
            Store::pack_bf16(values, packed);
        }
    }

    // Store the previous tile's pending wave and let the loader have that tile's slot.
    DG_DEVICE void flush() {
        if (pending) {
            put_packed(use - 1, kNumWaves - 1);
            TileSlots<Cfg>{smem}.release(use - 1);
            pending = false;
        }
    }

    // A computed tile's waves that have rows, from registers (the plain epilogue). row0: the warpgroup's first
    // row in the flattened output; tile_row: the same within the group's `rows`.
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
