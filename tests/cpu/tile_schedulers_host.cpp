// Host check of the tile schedulers (deepgemm/scheduler/grouped_tiles.cuh and persistent_tiles.cuh),
// compiled with the host C++ compiler by tests/cpu/test_tile_schedulers.py. Every CTA of a persistent grid runs a
// producer and a consumer copy of a scheduler; each tile is then "stored" the way the FP8 GEMM kernel
// stores it (64-row pieces per warpgroup and wave, the same skip rules as impls/sm90_fp8_gemm_1d2d.cuh), and
// every output row of every N-block must be written exactly once with the right group (or as padding).
// Random layouts over block_m 64/128/256, grid sizes below and above the tile count, both contiguous
// forms and the masked form. The dense split-tail scheduler must cover every (tile, K block) exactly
// once, give each CTA at most one split unit, and keep workspace slots and counters in range. The
// stream-tail scheduler must cover every (tile, K block) exactly once with one head and one end per tail
// tile, the head last in its CTA (the only unit that waits), cut at the K block the host model predicts.
// Prints "failures: N" last; the exit status is 1 when N > 0.
// `tile_schedulers_host dump FORM GROUPS ROWS` (tests/cpu/test_grouped_layouts.py) instead reads one grouping
// tensor's values from stdin, any values (malformed ones included), and prints the group each output row is
// written with (see dump_layout).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#define __host__
#define __device__
#define __forceinline__ inline
struct HostDim {
    unsigned x;
};
static HostDim blockIdx{0};
static HostDim gridDim{1};
static const int* g_valid_begin = nullptr;
static const int* g_valid_end = nullptr;
static long g_out_of_bounds_reads = 0;
template <typename T>
T __ldg(const T* p) {
    if (p < g_valid_begin || p >= g_valid_end) {
        ++g_out_of_bounds_reads;
        return T(0);
    }
    return *p;
}
using std::max;
using std::min;

#include <deepgemm/ptx/types.cuh>
#include <deepgemm/scheduler/grouped_tiles.cuh>
#include <deepgemm/scheduler/persistent_tiles.cuh>

using namespace deepgemm;

namespace {

constexpr int kPadding = -1;

struct Written {
    int group = -2;  // -2: never written
    int writes = 0;
};

// Stores one tile like the kernel: for each math warpgroup and wave, a 64-row piece.
template <u32 kBlockM>
void store_tile(const GroupedTile& tile, bool psum, const std::vector<int>& m_indices, u32 num_groups,
                std::vector<Written>& out, u32 m_limit) {
    constexpr u32 kWarpgroups = kBlockM == 64 ? 1 : 2;
    constexpr u32 kWaves = kBlockM / (64 * kWarpgroups);
    for (u32 wg = 0; wg < kWarpgroups; ++wg) {
        const u32 first_row = wg * 64;
        const u32 row_in_tensor = tile.m_block * kBlockM + first_row;
        const u32 row0 = tile.row_begin + row_in_tensor;
        if (!tile.padding && row_in_tensor >= tile.rows) {
            continue;  // this warpgroup has no rows: computes and stores nothing
        }
        for (u32 w = 0; w < kWaves; ++w) {
            const u32 offset = (w * kWarpgroups + wg) * 64 - first_row;
            if ((tile.padding || w > 0) && row_in_tensor + offset >= tile.rows) {
                break;
            }
            for (u32 r = 0; r < 64; ++r) {
                const u32 row = row0 + offset + r;
                if (row >= m_limit) {
                    continue;  // TMA clips at the tensor's edge
                }
                if (!tile.padding && tile.group >= num_groups) {
                    ++g_out_of_bounds_reads;  // the kernel would read B[group] and sfb[group] out of bounds
                }
                int group = tile.padding ? kPadding : static_cast<int>(tile.group);
                if (!tile.padding && !m_indices.empty()) {
                    const bool padding_row = psum ? row >= tile.valid_end
                                                  : static_cast<u32>(m_indices[row]) >= num_groups;
                    group = padding_row ? kPadding : group;
                }
                out[row].group = group;
                ++out[row].writes;
            }
        }
    }
}

// Runs every CTA's producer and consumer schedulers; returns the rows written per N-block.
template <typename Scheduler, u32 kBlockM, u32 kNumNBlocks, typename Make>
bool run_grid(u32 grid, u32 m_rows, bool psum, const std::vector<int>& m_indices, u32 num_groups, Make make,
              std::vector<std::vector<Written>>& out) {
    out.assign(kNumNBlocks, std::vector<Written>(m_rows));
    for (u32 cta = 0; cta < grid; ++cta) {
        blockIdx.x = cta;
        gridDim.x = grid;
        Scheduler producer = make();
        Scheduler consumer = make();
        GroupedTile a{};
        GroupedTile b{};
        for (u32 guard = 0;; ++guard) {
            const bool more_a = producer.next(a);
            const bool more_b = consumer.next(b);
            if (more_a != more_b || (more_a && (a.m_block != b.m_block || a.n_block != b.n_block || a.group != b.group ||
                                                 a.row_begin != b.row_begin || a.rows != b.rows || a.padding != b.padding))) {
                std::printf("producer and consumer disagree (cta %u)\n", cta);
                return false;
            }
            if (!more_a) {
                break;
            }
            if (guard > 1000000) {
                std::printf("scheduler does not terminate (cta %u)\n", cta);
                return false;
            }
            store_tile<kBlockM>(a, psum, m_indices, num_groups, out[a.n_block], m_rows);
        }
    }
    return true;
}

long g_failures = 0;
long g_split_units_seen = 0;

void fail(const char* what, u32 block_m, u32 grid, u32 n_block, u32 row, const Written& got, int expected) {
    if (++g_failures <= 10) {
        std::printf("FAIL %s block_m=%u grid=%u n_block=%u row=%u: writes=%d group=%d, expected group %d\n", what,
                    block_m, grid, n_block, row, got.writes, got.group, expected);
    }
}

template <u32 kBlockM, u32 kNumNBlocks, bool kRotateWaves = false>
void check_contiguous(const std::vector<int>& counts, u32 extra_padding_segments, u32 grid) {
    std::vector<int> m_indices;
    std::vector<int> psum;
    for (size_t g = 0; g < counts.size(); ++g) {
        const u32 padded = (static_cast<u32>(counts[g]) + 127) / 128 * 128;
        psum.push_back(static_cast<int>(m_indices.size()) + counts[g]);
        for (u32 i = 0; i < padded; ++i) {
            m_indices.push_back(i < static_cast<u32>(counts[g]) ? static_cast<int>(g) : kPadding);
        }
    }
    m_indices.insert(m_indices.end(), 128 * extra_padding_segments, kPadding);
    const u32 m = static_cast<u32>(m_indices.size());
    const u32 groups = static_cast<u32>(counts.size());
    if (m == 0) {
        return;
    }
    std::vector<std::vector<Written>> out;
    for (int form = 0; form < 3; ++form) {
        const bool by_psum = form == 1;
        const bool banded = form == 2;  // m_indices, bands of 8 M-blocks
        const std::vector<int>& grouping = by_psum ? psum : m_indices;
        g_valid_begin = grouping.data();
        g_valid_end = grouping.data() + grouping.size();
        bool ok;
        if (by_psum) {
            using S = ContiguousPsumTileScheduler<kBlockM, kNumNBlocks, kRotateWaves>;
            ok = run_grid<S, kBlockM, kNumNBlocks>(grid, m, true, m_indices, groups,
                                                   [&] { return S(psum.data(), m, groups); }, out);
        } else if (banded) {
            using S = ContiguousTileScheduler<kBlockM, kNumNBlocks, kRotateWaves, 8>;
            ok = run_grid<S, kBlockM, kNumNBlocks>(grid, m, false, m_indices, groups,
                                                   [&] { return S(m_indices.data(), m, groups); }, out);
        } else {
            using S = ContiguousTileScheduler<kBlockM, kNumNBlocks, kRotateWaves>;
            ok = run_grid<S, kBlockM, kNumNBlocks>(grid, m, false, m_indices, groups,
                                                   [&] { return S(m_indices.data(), m, groups); }, out);
        }
        const char* what = by_psum ? (kRotateWaves ? "contiguous psum, rotated" : "contiguous psum")
                           : banded ? "contiguous m_indices, bands of 8"
                                    : (kRotateWaves ? "contiguous m_indices, rotated" : "contiguous m_indices");
        if (!ok) {
            fail(what, kBlockM, grid, 0, 0, Written{}, 0);
            continue;
        }
        for (u32 n = 0; n < kNumNBlocks; ++n) {
            for (u32 row = 0; row < m; ++row) {
                const int expected = m_indices[row];
                if (out[n][row].writes != 1 || out[n][row].group != expected) {
                    fail(what, kBlockM, grid, n, row, out[n][row], expected);
                }
            }
        }
        if (g_out_of_bounds_reads) {
            std::printf("FAIL %s block_m=%u: %ld out-of-bounds reads of the grouping\n", what, kBlockM, g_out_of_bounds_reads);
            ++g_failures;
            g_out_of_bounds_reads = 0;
        }
    }
}

// The rotated walk spreads the last N-block's tiles over the CTAs (the plain walk gives them all to
// gridDim.x / N-blocks CTAs when the grid is a multiple of the N-block count): no CTA gets more than three above
// another (a Python model of the walk over 132/131/120/66 CTAs and 2-38 N-blocks: at most three).
template <u32 kBlockM, u32 kNumNBlocks>
void check_rotation_balance(u32 m, u32 grid) {
    std::vector<int> m_indices(m, 0);
    g_valid_begin = m_indices.data();
    g_valid_end = m_indices.data() + m_indices.size();
    std::vector<u32> last_block_tiles(grid, 0);
    for (u32 cta = 0; cta < grid; ++cta) {
        blockIdx.x = cta;
        gridDim.x = grid;
        ContiguousTileScheduler<kBlockM, kNumNBlocks, true> scheduler(m_indices.data(), m, 1);
        GroupedTile tile{};
        while (scheduler.next(tile)) {
            last_block_tiles[cta] += tile.n_block == kNumNBlocks - 1 ? 1 : 0;
        }
    }
    const auto [low, high] = std::minmax_element(last_block_tiles.begin(), last_block_tiles.end());
    if (*high > *low + 3 && ++g_failures <= 10) {
        std::printf("FAIL rotation balance block_m=%u n_blocks=%u m=%u grid=%u: %u to %u last-block tiles per CTA\n", kBlockM,
                    kNumNBlocks, m, grid, *low, *high);
    }
}

template <u32 kBlockM, u32 kNumNBlocks>
void check_masked(const std::vector<int>& masked_m, u32 max_m, u32 grid) {
    const u32 groups = static_cast<u32>(masked_m.size());
    g_valid_begin = masked_m.data();
    g_valid_end = masked_m.data() + masked_m.size();
    using S = MaskedTileScheduler<kBlockM, kNumNBlocks>;
    std::vector<std::vector<Written>> out;
    const std::vector<int> no_indices;
    if (!run_grid<S, kBlockM, kNumNBlocks>(grid, groups * max_m, false, no_indices, groups,
                                           [&] { return S(masked_m.data(), groups, max_m); }, out)) {
        fail("masked", kBlockM, grid, 0, 0, Written{}, 0);
        return;
    }
    for (u32 n = 0; n < kNumNBlocks; ++n) {
        for (u32 g = 0; g < groups; ++g) {
            const u32 valid = static_cast<u32>(std::clamp(masked_m[g], 0, static_cast<int>(max_m)));
            const u32 stored = std::min((valid + 63) / 64 * 64, max_m);  // whole 64-row pieces
            for (u32 r = 0; r < max_m; ++r) {
                const Written& got = out[n][g * max_m + r];
                const bool want = r < stored;
                if (got.writes != (want ? 1 : 0) || (want && got.group != static_cast<int>(g))) {
                    fail("masked", kBlockM, grid, n, g * max_m + r, got, want ? static_cast<int>(g) : -2);
                }
            }
        }
    }
}

template <u32 kBlockM, u32 kNumNBlocks>
void random_cases(std::mt19937& rng, int trials) {
    for (int trial = 0; trial < trials; ++trial) {
        const u32 groups = std::uniform_int_distribution<u32>(1, 12)(rng);
        std::vector<int> counts(groups);
        for (int& c : counts) {
            switch (std::uniform_int_distribution<int>(0, 4)(rng)) {
                case 0: c = 0; break;
                case 1: c = std::uniform_int_distribution<int>(1, 130)(rng); break;
                case 2: c = 128 * std::uniform_int_distribution<int>(1, 5)(rng); break;
                default: c = std::uniform_int_distribution<int>(1, 1200)(rng); break;
            }
        }
        const u32 grid = std::uniform_int_distribution<u32>(1, 40)(rng);
        const u32 padding_segments = std::uniform_int_distribution<u32>(0, 2)(rng);
        check_contiguous<kBlockM, kNumNBlocks>(counts, padding_segments, grid);
        check_contiguous<kBlockM, kNumNBlocks, true>(counts, padding_segments, grid);

        const u32 max_m = 64 * std::uniform_int_distribution<u32>(1, 12)(rng);
        std::vector<int> masked(groups);
        for (int& c : masked) {
            c = std::uniform_int_distribution<int>(-3, static_cast<int>(max_m) + 5)(rng);
        }
        check_masked<kBlockM, kNumNBlocks>(masked, max_m, grid);
    }
}

// The next unit of a CTA's producer and consumer copies of a split/stream scheduler, which must agree;
// false at the end of the schedule or on a disagreement (then ok = false).
template <typename Scheduler>
bool next_in_lockstep(Scheduler& producer, Scheduler& consumer, u32& mb, u32& nb, SplitUnit& unit, bool& ok) {
    u32 mb2 = 0, nb2 = 0;
    SplitUnit unit2{};
    const bool more = producer.next(mb, nb, unit);
    const bool more2 = consumer.next(mb2, nb2, unit2);
    if (more != more2 || (more && (mb != mb2 || nb != nb2 || unit.k_begin != unit2.k_begin || unit.k_end != unit2.k_end))) {
        ok = false;
        return false;
    }
    return more;
}

template <u32 kBlockM, u32 kNumNBlocks, u32 kNumKBlocks>
void check_split_tail(u32 m, u32 grid, u32 expected_splits = 0) {
    using S = SplitTailTileScheduler<kBlockM, kNumNBlocks, 8, kNumKBlocks>;
    const u32 m_blocks = (m + kBlockM - 1) / kBlockM;
    std::vector<int> covered(m_blocks * kNumNBlocks * kNumKBlocks, 0);
    std::vector<int> slot_used(grid, 0);
    bool ok = true;
    for (u32 cta = 0; cta < grid; ++cta) {
        blockIdx.x = cta;
        gridDim.x = grid;
        S producer(m);
        S consumer(m);
        u32 split_units = 0;
        for (;;) {
            u32 mb = 0, nb = 0;
            SplitUnit unit{};
            if (!next_in_lockstep(producer, consumer, mb, nb, unit, ok)) {
                break;
            }
            if (mb >= m_blocks || nb >= kNumNBlocks || unit.k_begin >= unit.k_end || unit.k_end > kNumKBlocks) {
                ok = false;
                break;
            }
            if (expected_splits != 0 && unit.splits != 1 && unit.splits != expected_splits) {
                ok = false;
            }
            if (unit.splits > 1) {
                ++split_units;
                ++g_split_units_seen;
                const bool slot_ok = unit.slot < grid && unit.slot / unit.splits == unit.tail_tile && 2 * unit.tail_tile < grid;
                if (!slot_ok || slot_used[unit.slot]++) {
                    ok = false;
                }
            }
            for (u32 kb = unit.k_begin; kb < unit.k_end; ++kb) {
                ++covered[(mb * kNumNBlocks + nb) * kNumKBlocks + kb];
            }
        }
        if (split_units > 1) {
            ok = false;
        }
    }
    for (int c : covered) {
        ok = ok && c == 1;
    }
    if (expected_splits > 1 && g_split_units_seen == 0) {
        ok = false;  // this case must split
    }
    g_split_units_seen = 0;
    if (!ok && ++g_failures <= 10) {
        std::printf("FAIL split tail block_m=%u n_blocks=%u k_blocks=%u m=%u grid=%u\n", kBlockM, kNumNBlocks, kNumKBlocks, m, grid);
    }
}

// expected_split: the head's length the host model (stream_tail_split) predicts; 0: nothing splits.
template <u32 kBlockM, u32 kNumNBlocks, u32 kNumKBlocks>
void check_stream_tail(u32 m, u32 grid, u32 expected_split) {
    using S = StreamTailTileScheduler<kBlockM, kNumNBlocks, 8, kNumKBlocks>;
    const u32 m_blocks = (m + kBlockM - 1) / kBlockM;
    const u32 tail = m_blocks * kNumNBlocks % grid;
    std::vector<int> covered(m_blocks * kNumNBlocks * kNumKBlocks, 0);
    std::vector<int> heads(grid, 0), ends(grid, 0);
    bool ok = true;
    bool split_seen = false;
    gridDim.x = grid;
    for (u32 cta = 0; cta < grid; ++cta) {
        blockIdx.x = cta;
        S producer(m);
        S consumer(m);
        bool head_seen = false;
        for (;;) {
            u32 mb = 0, nb = 0;
            SplitUnit unit{};
            if (!next_in_lockstep(producer, consumer, mb, nb, unit, ok)) {
                break;
            }
            if (head_seen || mb >= m_blocks || nb >= kNumNBlocks || unit.k_begin >= unit.k_end || unit.k_end > kNumKBlocks) {
                ok = false;  // (a head must be its CTA's last unit: nothing may wait behind it)
                break;
            }
            if (unit.splits > 1) {
                split_seen = true;
                const u32 cut = unit.k_begin == 0 ? unit.k_end : unit.k_begin;
                ok = ok && unit.splits == 2 && unit.tail_tile < tail && unit.slot == unit.tail_tile && cut == expected_split &&
                     (unit.k_begin == 0 ? unit.k_end < kNumKBlocks : unit.k_end == kNumKBlocks);
                // Ends run on the CTAs the last wave would leave idle, the lowest ones; each head on a CTA of
                // higher index than its end's (in-order dispatch then always runs the end first or alongside).
                if (unit.k_begin == 0) {
                    head_seen = true;
                    ok = ok && cta == grid - tail + unit.tail_tile && unit.tail_tile % (grid - tail) < cta;
                    ++heads[unit.tail_tile % grid];
                } else {
                    ok = ok && cta < grid - tail && cta == unit.tail_tile % (grid - tail);
                    ++ends[unit.tail_tile % grid];
                }
            } else {
                ok = ok && unit.k_begin == 0 && unit.k_end == kNumKBlocks;
            }
            for (u32 kb = unit.k_begin; kb < unit.k_end; ++kb) {
                ++covered[(mb * kNumNBlocks + nb) * kNumKBlocks + kb];
            }
        }
    }
    for (int c : covered) {
        ok = ok && c == 1;
    }
    for (u32 t = 0; t < grid; ++t) {
        ok = ok && heads[t] == ends[t] && heads[t] == (split_seen && t < tail ? 1 : 0);
    }
    ok = ok && split_seen == (expected_split != 0);
    if (!ok && ++g_failures <= 10) {
        std::printf("FAIL stream tail block_m=%u n_blocks=%u k_blocks=%u m=%u grid=%u\n", kBlockM, kNumNBlocks, kNumKBlocks, m, grid);
    }
}

// The host model's cut (kernels/sm90_fp8_gemm_1d2d/schedule.py stream_tail_split), 0 where nothing splits.
u32 model_stream_split(u32 tiles, u32 grid, u32 k_blocks) {
    const u32 tail = tiles % grid;
    if (tail * 2 <= grid) {
        return 0;
    }
    const u32 ends_per_cta = (tail + grid - tail - 1) / (grid - tail);
    const u32 split = (ends_per_cta * (k_blocks + 2) + ends_per_cta) / (ends_per_cta + 1);
    return split < k_blocks ? split : 0;
}

template <u32 kBlockM, u32 kNumNBlocks, u32 kNumKBlocks>
void random_stream_tail(std::mt19937& rng, int trials) {
    for (int trial = 0; trial < trials; ++trial) {
        const u32 m = std::uniform_int_distribution<u32>(1, 5000)(rng);
        const u32 grid = std::uniform_int_distribution<u32>(1, 140)(rng);
        const u32 tiles = (m + kBlockM - 1) / kBlockM * kNumNBlocks;
        check_stream_tail<kBlockM, kNumNBlocks, kNumKBlocks>(m, grid, model_stream_split(tiles, grid, kNumKBlocks));
    }
}

template <u32 kBlockM, u32 kNumNBlocks, u32 kNumKBlocks>
void random_split_tail(std::mt19937& rng, int trials) {
    for (int trial = 0; trial < trials; ++trial) {
        check_split_tail<kBlockM, kNumNBlocks, kNumKBlocks>(std::uniform_int_distribution<u32>(1, 5000)(rng),
                                                            std::uniform_int_distribution<u32>(1, 140)(rng));
    }
}

// One row of the dump per block_m: the group each output row is written with (-1: zeros, -2: never written), the
// same for every N-block and every grid (with and without the rotated walk), or "inconsistent"; "oob" when a
// scheduler read the grouping tensor, or a tile named a group, out of bounds. Contiguous forms: rows = M_total;
// masked: rows = max_m.
template <u32 kBlockM>
bool dump_block_m(const char* form, const std::vector<int>& grouping, u32 groups, u32 rows) {
    constexpr u32 kNumNBlocks = 3;
    const bool masked = std::strcmp(form, "masked") == 0;
    const bool psum = std::strcmp(form, "psum") == 0;
    const u32 m = masked ? groups * rows : rows;
    // store_tile applies the epilogue's padding-row rule (per row: m_indices out of range, or past valid_end for
    // psum); for psum it only needs a non-empty vector.
    const std::vector<int> indices = masked ? std::vector<int>{} : (psum ? std::vector<int>(m, 0) : grouping);
    g_valid_begin = grouping.data();
    g_valid_end = grouping.data() + grouping.size();
    g_out_of_bounds_reads = 0;
    std::vector<int> result;
    bool consistent = true;
    for (int rotate = 0; rotate < (masked ? 1 : 2); ++rotate) {
        for (u32 grid : {1u, 3u, 7u, 132u}) {
            std::vector<std::vector<Written>> out;
            bool ok;
            if (masked) {
                using S = MaskedTileScheduler<kBlockM, kNumNBlocks>;
                ok = run_grid<S, kBlockM, kNumNBlocks>(grid, m, false, indices, groups,
                                                       [&] { return S(grouping.data(), groups, rows); }, out);
            } else if (psum && rotate) {
                using S = ContiguousPsumTileScheduler<kBlockM, kNumNBlocks, true>;
                ok = run_grid<S, kBlockM, kNumNBlocks>(grid, m, true, indices, groups,
                                                       [&] { return S(grouping.data(), m, groups); }, out);
            } else if (psum) {
                using S = ContiguousPsumTileScheduler<kBlockM, kNumNBlocks, false>;
                ok = run_grid<S, kBlockM, kNumNBlocks>(grid, m, true, indices, groups,
                                                       [&] { return S(grouping.data(), m, groups); }, out);
            } else if (rotate) {
                using S = ContiguousTileScheduler<kBlockM, kNumNBlocks, true>;
                ok = run_grid<S, kBlockM, kNumNBlocks>(grid, m, false, indices, groups,
                                                       [&] { return S(grouping.data(), m, groups); }, out);
            } else {
                using S = ContiguousTileScheduler<kBlockM, kNumNBlocks, false>;
                ok = run_grid<S, kBlockM, kNumNBlocks>(grid, m, false, indices, groups,
                                                       [&] { return S(grouping.data(), m, groups); }, out);
            }
            consistent = consistent && ok;
            for (u32 n = 0; ok && n < kNumNBlocks; ++n) {
                std::vector<int> rows_written(m);
                for (u32 row = 0; row < m; ++row) {
                    const Written& w = out[n][row];
                    consistent = consistent && w.writes <= 1;
                    rows_written[row] = w.writes == 0 ? -2 : w.group;
                }
                if (result.empty()) {
                    result = rows_written;
                } else {
                    consistent = consistent && result == rows_written;
                }
            }
        }
    }
    std::printf("block_m=%u", kBlockM);
    if (g_out_of_bounds_reads) {
        std::printf(" oob\n");
        return false;
    }
    if (!consistent) {
        std::printf(" inconsistent\n");
        return false;
    }
    for (int v : result) {
        std::printf(" %d", v);
    }
    std::printf("\n");
    return true;
}

int dump_layout(int argc, char** argv) {
    if (argc != 5) {
        std::printf("usage: %s dump m_indices|psum|masked GROUPS ROWS < values\n", argv[0]);
        return 2;
    }
    const u32 groups = static_cast<u32>(std::atoi(argv[3]));
    const u32 rows = static_cast<u32>(std::atoi(argv[4]));
    std::vector<int> grouping;
    for (int v; std::scanf("%d", &v) == 1;) {
        grouping.push_back(v);
    }
    bool ok = dump_block_m<64>(argv[2], grouping, groups, rows);
    ok = dump_block_m<128>(argv[2], grouping, groups, rows) && ok;
    ok = dump_block_m<256>(argv[2], grouping, groups, rows) && ok;
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "dump") == 0) {
        return dump_layout(argc, argv);
    }
    std::mt19937 rng(2026);
    // The psum layout of the GPU test, with grids that make one CTA revisit an M-block for its next N-block.
    for (u32 grid : {132u, 32u, 31u, 16u, 5u, 1u}) {
        check_contiguous<256, 32>({1000, 1100, 0, 2300, 129, 3000}, 1, grid);
        check_contiguous<128, 32>({1000, 1100, 0, 2300, 129, 3000}, 1, grid);
        check_contiguous<256, 32, true>({1000, 1100, 0, 2300, 129, 3000}, 1, grid);
        check_contiguous<128, 22, true>({7400, 8100, 0, 6500}, 1, grid);  // N = 4096 in 128 x 192 tiles: 22 N-blocks
    }
    for (u32 grid : {132u, 131u, 120u, 66u}) {
        check_rotation_balance<128, 22>(34176, grid);  // the issue-5 layout 4 x ~8538 rows, N = 4096
        check_rotation_balance<128, 22>(128 * 300, grid);
        check_rotation_balance<128, 38>(128 * 267, grid);  // N = 7168
        check_rotation_balance<128, 38>(128 * 300, grid);
        check_rotation_balance<256, 11>(256 * 250, grid);
    }
    random_cases<256, 3>(rng, 400);
    random_cases<256, 1>(rng, 200);
    random_cases<128, 3>(rng, 300);
    random_cases<64, 2>(rng, 200);
    check_split_tail<128, 17, 56>(4096, 132, 8);  // 4096 x 2112 x 7168: 16 tail tiles x 8 ranges
    check_split_tail<256, 17, 56>(4096, 132, 8);  // 272 tiles: 8 x 8
    check_split_tail<128, 17, 56>(4096, 136, 1);  // 544 = 4 x 136: no tail, no split
    check_split_tail<64, 64, 16>(129, 60, 5);     // 192 tiles: 12 x 5
    check_split_tail<64, 17, 56>(64, 132, 7);     // decode 64 x 2112 x 7168: 17 tiles, all split 7 ways
    check_split_tail<192, 8, 56>(4096, 132, 3);   // 4096 x 1024 x 7168 with block_m 192: 176 tiles, 44 x 3
    check_split_tail<192, 17, 56>(4096, 132, 1);  // 4096 x 2112 x 7168: 374 tiles, tail 110: no split
    random_split_tail<128, 17, 56>(rng, 300);
    random_split_tail<256, 3, 2>(rng, 300);
    random_split_tail<64, 64, 16>(rng, 300);
    random_split_tail<128, 1, 1>(rng, 200);
    random_split_tail<192, 17, 56>(rng, 200);
    // The same cases as tests/cpu/test_split_tail_cpu.py's schedule test (split = the host model's cut).
    check_stream_tail<256, 32, 56>(4096, 132, 52);   // 4096 x 4096 x 7168: 116 tail tiles, 8 ends per idle CTA
    check_stream_tail<256, 56, 128>(4096, 132, 104); // 4096 x 7168 x 16384: 104 tail tiles, 4 ends each
    check_stream_tail<128, 11, 56>(4096, 132, 39);   // 4096 x 2112 x 7168 with 128 x 192 tiles: 88 tail tiles
    check_stream_tail<256, 8, 56>(1024, 12, 39);     // 32 tiles on 12 CTAs
    check_stream_tail<64, 17, 56>(64, 24, 44);       // 17 tiles on 24 CTAs: every tile is a tail tile
    check_stream_tail<64, 64, 16>(192, 120, 12);     // 192 tiles on 120 CTAs
    check_stream_tail<64, 64, 16>(192, 100, 0);      // 12 ends per idle CTA: a head would need all 16 K blocks
    check_stream_tail<256, 33, 56>(4096, 132, 0);    // 528 tiles: whole waves
    check_stream_tail<256, 32, 56>(4096, 300, 44);   // 512 tiles on 300 CTAs: one full wave, a tail of 212, 3 ends each
    check_stream_tail<256, 32, 56>(4096, 1000, 39);  // 512 tiles on 1000 CTAs: all tail, 2 ends per idle CTA at most
    check_stream_tail<256, 32, 56>(4096, 1100, 0);   // 512 tiles on 1100 CTAs: at most half of the grid, nothing splits
    random_stream_tail<256, 32, 56>(rng, 300);
    random_stream_tail<128, 11, 56>(rng, 300);
    random_stream_tail<64, 64, 16>(rng, 300);
    random_stream_tail<192, 3, 2>(rng, 300);
    std::printf("failures: %ld\n", g_failures);
    return g_failures ? 1 : 0;
}
