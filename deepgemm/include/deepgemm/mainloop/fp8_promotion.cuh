// Promotion of a K block's FP32 wgmma partial into the output accumulator with its 1D2D scales:
//   result += sfa[row] * sfb[128-column block] * partial,
// on the CUDA cores, every 128-wide K block (never one long FP8 accumulation). A tile whose columns straddle
// two 128-column scale blocks uses the second block's sfb from its switch column on.
#pragma once
#include <deepgemm/ptx/types.cuh>

namespace deepgemm {

// sfa of this thread's two rows (row_in_wg and row_in_wg + 8) for one K block.
struct ScaleA {
    float lo;
    float hi;
};

// sfb of one K block for the tile's columns (second: the next 128-column scale block, straddling tiles).
struct ScaleB {
    float first;
    float second;
};

// The two row scales (sfa x sfb) of this thread's rows for both column ranges of a tile.
struct BlockScales {
    float lo0;
    float hi0;
    float lo1;
    float hi1;
};

// result += (sfa x sfb) * partial for one K block of a kBlockN-wide tile. The scales are read and multiplied
// before the block's MMAs retire, so the FFMAs start as soon as the wait returns.
template <u32 kBlockN, u32 kNumKBlocks>
struct Fp8Promotion {
    static constexpr u32 kScaleBlock = 128;
    static constexpr bool kMayStraddle = (kScaleBlock % kBlockN) != 0;
    static constexpr u32 kStraddleStep = gcd(kBlockN, kScaleBlock);

    const float* sfb_tile;  // the tile's staged sfb: ceil(K/128) scales per scale block
    u32 straddle_col;       // tile columns at or past this offset use the next 128-column scale block

    DG_DEVICE ScaleB scale_b(u32 k_block) const {
        ScaleB b;
        b.first = sfb_tile[k_block];
        b.second = kMayStraddle ? sfb_tile[kNumKBlocks + k_block] : b.first;
        return b;
    }

    DG_DEVICE static BlockScales combine(const ScaleA& a, const ScaleB& b) {
        return BlockScales{a.lo * b.first, a.hi * b.first, a.lo * b.second, a.hi * b.second};
    }

    // kStraddleCol: the switch column when known at compile time, 0 when only `straddle_col` knows it.
    // kTileN: the columns computed (into the first kTileN / 2 registers of `result`).
    template <u32 kStraddleCol, u32 kTileN>
    DG_DEVICE void apply(float (&result)[kBlockN / 2], const float (&partial)[kTileN / 2], const BlockScales& s) const {
#pragma unroll
        for (u32 j = 0; j < kTileN / 8; ++j) {
            const u32 col = j * 8;
            bool second = false;
            if constexpr (kMayStraddle && kStraddleCol != 0) {
                second = col >= kStraddleCol;
            } else if constexpr (kMayStraddle) {
                second = col >= kScaleBlock || (col >= kStraddleStep && col >= straddle_col);
            }
            const float lo = second ? s.lo1 : s.lo0;
            const float hi = second ? s.hi1 : s.hi0;
            result[j * 4 + 0] += lo * partial[j * 4 + 0];
            result[j * 4 + 1] += lo * partial[j * 4 + 1];
            result[j * 4 + 2] += hi * partial[j * 4 + 2];
            result[j * 4 + 3] += hi * partial[j * 4 + 3];
        }
    }
};

}  // namespace deepgemm
