"""TMA descriptors (CUtensorMap) for 2-D row-major and 3-D strided tensors, encoded once and cached."""

from __future__ import annotations

import ctypes
from collections import OrderedDict

import torch

from deepgemm.jit.args import DESCRIPTOR_BYTES
from deepgemm.jit.driver import check, driver

_CACHE_CAPACITY = 4096
_SWIZZLES = {
    0: lambda s: s.CU_TENSOR_MAP_SWIZZLE_NONE,
    32: lambda s: s.CU_TENSOR_MAP_SWIZZLE_32B,
    64: lambda s: s.CU_TENSOR_MAP_SWIZZLE_64B,
    128: lambda s: s.CU_TENSOR_MAP_SWIZZLE_128B,
}
_cache: OrderedDict[tuple, bytes] = OrderedDict()


def _data_type(dtype: torch.dtype):  # -> CUtensorMapDataType
    cu = driver()
    kinds = cu.CUtensorMapDataType
    table = {
        torch.float8_e4m3fn: kinds.CU_TENSOR_MAP_DATA_TYPE_UINT8,
        torch.uint8: kinds.CU_TENSOR_MAP_DATA_TYPE_UINT8,
        torch.bfloat16: kinds.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        torch.float16: kinds.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        torch.float32: kinds.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    }
    return table[dtype]


def encode_2d(
    ptr: int, dtype: torch.dtype, rows: int, cols: int, row_stride_elems: int, box_rows: int, box_cols: int, swizzle_bytes: int
) -> bytes:
    """Descriptor of a [rows, cols] tensor (cols contiguous) read/written in [box_rows, box_cols] boxes.

    swizzle_bytes is 0 (none), 32, 64 or 128 (box rows of that many bytes, 16-byte chunks XOR-permuted).
    Boxes that overhang the tensor read zeros and write nothing outside it.
    """
    return _encode(ptr, dtype, (cols, rows), (row_stride_elems,), (box_cols, box_rows), swizzle_bytes)


def encode_3d(ptr: int, dtype: torch.dtype, sizes: tuple[int, int, int], strides_elems: tuple[int, int],
              box: tuple[int, int, int], swizzle_bytes: int = 0) -> bytes:
    """Descriptor of a 3-D tensor, innermost dimension first: sizes (d0, d1, d2) with d0 contiguous and
    strides_elems the element strides of d1 and d2 (each a multiple of 16 bytes); boxes of `box`, swizzled as
    encode_2d's. Boxes that overhang a dimension read zeros there and write nothing (never the neighbouring slice)."""
    return _encode(ptr, dtype, sizes, strides_elems, box, swizzle_bytes)


def _encode(ptr: int, dtype: torch.dtype, sizes: tuple[int, ...], strides_elems: tuple[int, ...], box: tuple[int, ...],
            swizzle_bytes: int) -> bytes:
    key = (ptr, dtype, sizes, strides_elems, box, swizzle_bytes)
    cached = _cache.get(key)
    if cached is not None:
        return cached
    cu = driver()
    elem = torch.empty((), dtype=dtype).element_size()
    swizzle = cu.CUtensorMapSwizzle
    tensor_map = check(
        cu.cuTensorMapEncodeTiled(
            _data_type(dtype),
            len(sizes),
            ptr,
            [cu.cuuint64_t(size) for size in sizes],
            [cu.cuuint64_t(stride * elem) for stride in strides_elems],
            [cu.cuuint32_t(edge) for edge in box],
            [cu.cuuint32_t(1)] * len(sizes),
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            _SWIZZLES[swizzle_bytes](swizzle),
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ),
        f"cuTensorMapEncodeTiled(sizes={sizes}, strides={strides_elems}, box={box}; innermost dimension first)",
    )
    raw = ctypes.string_at(tensor_map.getPtr(), DESCRIPTOR_BYTES)
    if len(_cache) >= _CACHE_CAPACITY:
        _cache.popitem(last=False)
    _cache[key] = raw
    return raw
