"""One BF16 GEMM tile configuration and the shared-memory footprint it implies (mirrors Sm90Bf16Gemm)."""

from __future__ import annotations

from dataclasses import dataclass

from deepgemm.utils import align_up

BLOCK_K = 64  # K per pipeline stage: one 128-byte swizzled row of a K-major tile
ATOM = 64     # MN elements per 128-byte row of an MN-major tile
BARRIER_BYTES = 8


def store_buffer_bytes(block_n: int, out_bytes: int) -> int:
    """Mirrors WarpgroupTileStore::kBytes: a warpgroup's 64 x block_n staging tile cut into swizzled pieces."""
    row = block_n * out_bytes
    full = row // 128
    tail = row % 128
    t64 = full * 64 * 128
    t32 = t64 + (64 * 64 if tail & 64 else 0)
    t16 = align_up(t32 + (64 * 32 if tail & 32 else 0), 1024)
    return align_up(t16 + (64 * 16 if tail & 16 else 0), 1024)


SPLIT_FLAG_BYTES = 16  # split-K: one reduction flag per math warpgroup


def store_chunk_columns(block_n: int, out_bytes: int) -> int:
    """The chunk width of a chunked epilogue: the widest of 128-, 64- and 32-byte output rows that divides block_n
    (each a single store piece with its own swizzle, epilogue/store_fragment.cuh), else 8 columns."""
    columns = 128 // out_bytes
    while block_n % columns and columns > 8:
        columns //= 2
    return columns


def warpgroup_store_bytes(block_n: int, out_bytes: int, store_n: int = 0) -> int:
    """Mirrors Sm90Bf16Gemm::kWarpgroupDBytes: one whole-tile staging buffer (store_n 0), or two store_n-column
    chunk buffers used in turn."""
    if store_n in (0, block_n):
        return store_buffer_bytes(block_n, out_bytes)
    return 2 * store_buffer_bytes(store_n, out_bytes)


def bf16_smem_bytes(block_m: int, block_n: int, stages: int, out_bytes: int, split_k: bool = False,
                    store_n: int = 0) -> int:
    """Mirrors Sm90Bf16Gemm::kSmemBytes."""
    stage = (block_m + block_n) * BLOCK_K * 2
    return (stages * stage + (block_m // 64) * warpgroup_store_bytes(block_n, out_bytes, store_n)
            + 2 * stages * BARRIER_BYTES + (SPLIT_FLAG_BYTES if split_k else 0))


@dataclass(frozen=True)
class Bf16GemmConfig:
    """Tile and pipeline of one instantiation: block_m 64 or 128 (one or two math warpgroups), block_n a multiple of
    8 up to 256 (of 64 when B is MN-major), group_rows the raster band height, num_sms the persistent grid cap;
    split_k (dense): a last wave of at most half the grid runs cut into K ranges (SplitTailTileScheduler); store_n:
    0 stores a warpgroup's tile through one staging buffer, else in store_n-column chunks through two;
    balanced_grid (dense, not split): the fewest CTAs that keep the wave count (common.grid.balanced_grid), a launch
    choice only (the kernel walks tiles by gridDim.x)."""

    block_m: int
    block_n: int
    num_stages: int
    group_rows: int
    num_sms: int
    split_k: bool = False
    store_n: int = 0
    balanced_grid: bool = False

    @property
    def num_threads(self) -> int:
        return 128 + 128 * (self.block_m // 64)

    @property
    def num_math_warpgroups(self) -> int:
        return self.block_m // 64

    @property
    def block_k(self) -> int:
        return BLOCK_K

    def smem_bytes(self, out_bytes: int) -> int:
        return bf16_smem_bytes(self.block_m, self.block_n, self.num_stages, out_bytes, self.split_k, self.store_n)

    def label(self) -> str:
        split = " splitk" if self.split_k else ""
        chunks = f" store{self.store_n}" if self.store_n else ""
        balanced = " bal" if self.balanced_grid else ""
        return (f"bm{self.block_m} bn{self.block_n} st{self.num_stages} g{self.group_rows} sms{self.num_sms}"
                f"{split}{chunks}{balanced}")
