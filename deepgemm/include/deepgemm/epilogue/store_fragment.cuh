// Epilogue: one warpgroup's 64 x BLOCK_N FP32 accumulator fragment -> shared memory (BF16 or FP32)
// -> TMA stores. TMA clips rows/columns outside the output tensor.
//
// Bank conflicts: a plain row-major tile puts the 8 rows a warp writes at once into the same banks.
// Instead each row is cut into "pieces" of 128, 64, 32 or 16 bytes (as many 128-byte pieces as fit,
// then the binary remainder). Piece p is stored as its own dense [64 rows][width] block using TMA's
// swizzle of that width (16-byte chunk index XOR row bits), and stored with its own descriptor.
// Within a warp the 8 rows then hit 8 different chunks: conflict-free.
#pragma once
#include <deepgemm/ptx/sync.cuh>
#include <deepgemm/ptx/tma.cuh>

namespace deepgemm {

// One TMA descriptor per piece width, each with box [64 rows, width bytes] and the matching swizzle.
struct OutputDescriptors {
    TmaDescriptor width128;  // CU_TENSOR_MAP_SWIZZLE_128B
    TmaDescriptor width64;   // CU_TENSOR_MAP_SWIZZLE_64B
    TmaDescriptor width32;   // CU_TENSOR_MAP_SWIZZLE_32B
    TmaDescriptor width16;   // CU_TENSOR_MAP_SWIZZLE_NONE
};

// kBuffers staging buffers of kBytes each, used in turn: a store waits only until the store that last used
// its buffer (kBuffers stores earlier) has been read, so with two buffers consecutive stores overlap.
// kRank 3: the descriptors are 3-D [slices, rows, cols] (boxes one slice deep), and a store names its slice z,
// so TMA clips rows at the end of each slice (the k-grouped outputs [G, M, N] with any M).
// kReduceAdd: the tile is added into the output (TMA reduce-add) instead of overwriting it.
template <u32 kBlockN, bool kOutputFp32, u32 kBuffers = 1, u32 kRank = 2, bool kReduceAdd = false>
struct WarpgroupTileStore {
    static_assert(kRank == 2 || kRank == 3, "2-D or 3-D output descriptors");
    static constexpr u32 kElemBytes = kOutputFp32 ? 4 : 2;
    static constexpr u32 kRowBytes = kBlockN * kElemBytes;
    static_assert(kRowBytes % 16 == 0, "output rows of a tile must be whole 16-byte chunks");
    static constexpr u32 kFullPieces = kRowBytes / 128;
    static constexpr u32 kTail = kRowBytes % 128;  // split into 64/32/16-byte pieces by its set bits
    static constexpr u32 kPieceAlign = 1024;       // every swizzle pattern repeats within 1024 bytes
    static constexpr u32 kFullBytes = kFullPieces * 64 * 128;
    static constexpr u32 kTail64Offset = kFullBytes;
    static constexpr u32 kTail32Offset = kTail64Offset + ((kTail & 64) ? 64 * 64 : 0);
    static constexpr u32 kTail16Offset = align_up(kTail32Offset + ((kTail & 32) ? 64 * 32 : 0), kPieceAlign);
    static constexpr u32 kBytes = align_up(kTail16Offset + ((kTail & 16) ? 64 * 16 : 0), kPieceAlign);

    u8* buffers;  // kBuffers x kBytes of shared memory, 1024-byte aligned
    u32 count;    // stores issued so far: the next one uses buffer count % kBuffers

    // Shared-memory offset of byte `byte_in_row` of tile row `row`, swizzled within its piece.
    DG_DEVICE static u32 smem_offset(u32 row, u32 byte_in_row) {
        u32 base;
        u32 width;
        u32 offset;
        if (byte_in_row < kFullPieces * 128) {
            base = (byte_in_row / 128) * 64 * 128;
            width = 128;
            offset = byte_in_row % 128;
        } else {
            u32 rest = byte_in_row - kFullPieces * 128;
            if ((kTail & 64) && rest < 64) {
                base = kTail64Offset, width = 64, offset = rest;
            } else {
                rest -= (kTail & 64);
                if ((kTail & 32) && rest < 32) {
                    base = kTail32Offset, width = 32, offset = rest;
                } else {
                    base = kTail16Offset, width = 16, offset = rest - (kTail & 32);
                }
            }
        }
        const u32 raw = row * width + offset;
        const u32 chunk_mask = width / 16 - 1;
        return base + (raw ^ (((raw >> 7) & chunk_mask) << 4));
    }

    // `values` is the wgmma m64nN accumulator layout: register 4j+r of lane l in warp w holds
    // row 16w + l/4 + 8(r/2), column 8j + 2(l%4) + r%2.
    // Every thread of the warpgroup calls it with the same arguments; one TMA bulk group per call.
    DG_DEVICE void store(const float (&values)[kBlockN / 2], const OutputDescriptors* out, u32 col, u32 row,
                         u32 thread_in_wg, u32 barrier_id, u32 z = 0) {
        if constexpr (kOutputFp32) {
            const u32 warp = thread_in_wg / 32;
            const u32 lane = thread_in_wg % 32;
            u8* smem_tile = begin(thread_in_wg, barrier_id);
#pragma unroll
            for (u32 j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
                for (u32 half = 0; half < 2; ++half) {
                    const u32 r = warp * 16 + lane / 4 + half * 8;
                    const u32 c = j * 8 + (lane % 4) * 2;
                    *reinterpret_cast<float2*>(smem_tile + smem_offset(r, c * kElemBytes)) =
                        make_float2(values[j * 4 + half * 2], values[j * 4 + half * 2 + 1]);
                }
            }
            finish(smem_tile, out, col, row, thread_in_wg, barrier_id, z);
        } else {
            u32 packed[kBlockN / 4];
            pack_bf16(values, packed);
            store_bf16(packed, out, col, row, thread_in_wg, barrier_id, z);
        }
    }

    // The BF16 pairs of an accumulator fragment (register i = values 2i, 2i + 1): half the registers, so a
    // fragment can wait for its store while the accumulators are busy.
    DG_DEVICE static void pack_bf16(const float (&values)[kBlockN / 2], u32 (&packed)[kBlockN / 4]) {
#pragma unroll
        for (u32 i = 0; i < kBlockN / 4; ++i) {
            packed[i] = ptx::pack_bf16x2(values[2 * i], values[2 * i + 1]);
        }
    }

    // store() of a BF16 output from its packed pairs.
    DG_DEVICE void store_bf16(const u32 (&packed)[kBlockN / 4], const OutputDescriptors* out, u32 col, u32 row,
                              u32 thread_in_wg, u32 barrier_id, u32 z = 0) {
        static_assert(!kOutputFp32, "packed BF16 stores are for BF16 output");
        const u32 warp = thread_in_wg / 32;
        const u32 lane = thread_in_wg % 32;
        u8* smem_tile = begin(thread_in_wg, barrier_id);
        // One stmatrix per 16 columns (8x8 matrices (j, rows 0-7), (j, rows 8-15), (j + 1, ...), ...);
        // lane l addresses row l % 8 of matrix l / 8, a 16-byte chunk that the swizzle keeps whole.
        const u32 matrix = lane / 8;
        const u32 matrix_row = warp * 16 + (matrix % 2) * 8 + lane % 8;
#pragma unroll
        for (u32 j = 0; j + 1 < kBlockN / 8; j += 2) {
            ptx::stmatrix_x4(smem_tile + smem_offset(matrix_row, (j + matrix / 2) * 16), packed[j * 2], packed[j * 2 + 1],
                             packed[j * 2 + 2], packed[j * 2 + 3]);
        }
        if constexpr (kBlockN % 16 != 0) {
            constexpr u32 j = kBlockN / 8 - 1;
            ptx::stmatrix_x2(smem_tile + smem_offset(matrix_row, j * 16), packed[j * 2], packed[j * 2 + 1]);
        }
        finish(smem_tile, out, col, row, thread_in_wg, barrier_id, z);
    }

    // The next staging buffer, once the store that last used it (kBuffers bulk groups ago) has read it.
    DG_DEVICE u8* begin(u32 thread_in_wg, u32 barrier_id) {
        u8* smem_tile = buffers + (kBuffers == 1 ? 0u : count % kBuffers) * kBytes;
        ++count;
        if (thread_in_wg == 0) {
            ptx::tma_store_wait_read<kBuffers - 1>();
        }
        ptx::named_barrier_sync(barrier_id, 128);
        return smem_tile;
    }

    // Every thread's writes to the staging buffer are done: one thread stores it with TMA.
    DG_DEVICE static void store_piece(const TmaDescriptor* desc, const u8* smem_piece, u32 col, i32 y, u32 z) {
        if constexpr (kRank == 3 && kReduceAdd) {
            ptx::tma_reduce_add_3d(desc, smem_piece, static_cast<i32>(col), y, static_cast<i32>(z));
        } else if constexpr (kRank == 3) {
            ptx::tma_store_3d(desc, smem_piece, static_cast<i32>(col), y, static_cast<i32>(z));
        } else if constexpr (kReduceAdd) {
            ptx::tma_reduce_add_2d(desc, smem_piece, static_cast<i32>(col), y);
        } else {
            ptx::tma_store_2d(desc, smem_piece, static_cast<i32>(col), y);
        }
    }

    DG_DEVICE static void finish(u8* smem_tile, const OutputDescriptors* out, u32 col, u32 row, u32 thread_in_wg,
                                 u32 barrier_id, u32 z = 0) {
        ptx::fence_proxy_async_smem();
        ptx::named_barrier_sync(barrier_id, 128);
        if (thread_in_wg == 0) {
            const i32 y = static_cast<i32>(row);
#pragma unroll
            for (u32 p = 0; p < kFullPieces; ++p) {
                store_piece(&out->width128, smem_tile + p * 64 * 128, col + p * 128 / kElemBytes, y, z);
            }
            u32 tail_col = col + kFullPieces * 128 / kElemBytes;
            if constexpr ((kTail & 64) != 0) {
                store_piece(&out->width64, smem_tile + kTail64Offset, tail_col, y, z);
                tail_col += 64 / kElemBytes;
            }
            if constexpr ((kTail & 32) != 0) {
                store_piece(&out->width32, smem_tile + kTail32Offset, tail_col, y, z);
                tail_col += 32 / kElemBytes;
            }
            if constexpr ((kTail & 16) != 0) {
                store_piece(&out->width16, smem_tile + kTail16Offset, tail_col, y, z);
            }
            ptx::tma_store_commit();
        }
    }

    DG_DEVICE static void drain(u32 thread_in_wg) {
        if (thread_in_wg == 0) {
            ptx::tma_store_wait<0>();
        }
    }
};

}  // namespace deepgemm
