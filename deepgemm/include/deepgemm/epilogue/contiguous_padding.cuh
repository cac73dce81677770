// Padding rows of the contiguous grouped layouts in a GEMM's output (the FP8 1D2D and the BF16 kernels): a
// block of padding rows is stored as zeros without reading anything, and padding rows inside a computed block
// are zeroed in the registers before the tile is stored. Cfg describes the tile: kBlockM, kBlockN, kStoreN,
// kStoreChunks, kNumWaves, wave_row(w, math_wg), Store and kKind.
#pragma once
#include <deepgemm/epilogue/store_fragment.cuh>
#include <deepgemm/scheduler/tile_sources.cuh>

namespace deepgemm {

template <typename Cfg>
struct PaddingRows {
    static constexpr u32 kBlockN = Cfg::kBlockN;
    static constexpr u32 kStoreN = Cfg::kStoreN;
    static constexpr u32 kNumWaves = Cfg::kNumWaves;
    using Store = typename Cfg::Store;

    // A block of padding rows: this warpgroup's waves that have rows, as zeros.
    DG_DEVICE static void store_block(Store& store, const OutputDescriptors* tma_d, const GroupedTile& tile, u32 math_wg,
                                      u32 thread_in_wg, u32 barrier_id) {
        const u32 first_row = Cfg::wave_row(0, math_wg);
        const u32 row_in_tensor = tile.m_block * Cfg::kBlockM + first_row;
        float zeros[kStoreN / 2];
#pragma unroll
        for (u32 i = 0; i < kStoreN / 2; ++i) {
            zeros[i] = 0.0f;
        }
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
            const u32 wave_offset = Cfg::wave_row(w, math_wg) - first_row;
            if (row_in_tensor + wave_offset >= tile.rows) {
                break;
            }
#pragma unroll
            for (u32 c = 0; c < Cfg::kStoreChunks; ++c) {
                store.store(zeros, tma_d, tile.n_block * kBlockN + c * kStoreN, tile.row_begin + row_in_tensor + wave_offset,
                            thread_in_wg, barrier_id);
            }
        }
    }

    // The m_indices entries of this thread's rows (entry 2 w + h: row row_in_wg + 8 h of wave w; rows past M read
    // as group 0), loaded at the tile's start so that the loads complete during the K loop instead of stalling the
    // epilogue. The psum form loads nothing (its tile carries valid_end). row0: the warpgroup's first row in the
    // flattened output.
    struct RowGroups {
        u32 group[2 * kNumWaves];
    };

    template <typename Problem>
    DG_DEVICE static RowGroups load_row_groups(const Problem& problem, u32 row0, u32 math_wg, u32 first_row, u32 row_in_wg) {
        RowGroups groups{};
        if constexpr (Cfg::kKind == GemmKind::kGroupedContiguous) {
#pragma unroll
            for (u32 w = 0; w < kNumWaves; ++w) {
#pragma unroll
                for (u32 half = 0; half < 2; ++half) {
                    const u32 row = row0 + (Cfg::wave_row(w, math_wg) - first_row) + row_in_wg + half * 8;
                    groups.group[2 * w + half] = row < problem.m ? static_cast<u32>(__ldg(problem.grouping + row)) : 0u;
                }
            }
        }
        return groups;
    }

    // Padding rows inside a computed block (m_indices == -1, or any index outside [0, G); psum form: rows past
    // the group's end) become zeros.
    template <typename Problem>
    DG_DEVICE static void zero_rows(float (&results)[kNumWaves][kBlockN / 2], const Problem& problem, const GroupedTile& tile,
                                    u32 row0, u32 math_wg, u32 first_row, u32 row_in_wg, RowGroups groups) {
        const u32 valid_end = tile.valid_end;
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
#pragma unroll
            for (u32 half = 0; half < 2; ++half) {
                const u32 row = row0 + (Cfg::wave_row(w, math_wg) - first_row) + row_in_wg + half * 8;
                bool padding_row;
                if constexpr (Cfg::kKind == GemmKind::kGroupedContiguous) {
                    padding_row = groups.group[2 * w + half] >= problem.num_groups;
                } else {
                    padding_row = row >= valid_end;
                }
                if (padding_row) {
#pragma unroll
                    for (u32 j = 0; j < kBlockN / 8; ++j) {
                        results[w][j * 4 + half * 2] = 0.0f;
                        results[w][j * 4 + half * 2 + 1] = 0.0f;
                    }
                }
            }
        }
    }
};

}  // namespace deepgemm
