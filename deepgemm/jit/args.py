"""Kernel parameters packed once into a ctypes buffer, with the void** array cuLaunchKernelEx reads."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

U32 = ctypes.c_uint32
U64 = ctypes.c_uint64
DESCRIPTOR_BYTES = 128


class PackedArgs:
    """Immutable packed kernel arguments.

    Each value is either `bytes` (copied verbatim, e.g. a 128-byte TMA descriptor, placed at a
    64-byte-aligned offset) or a ctypes scalar instance (c_uint32, c_uint64, ...). `address` is the
    value to pass as `kernelParams`.
    """

    __slots__ = ("_buffer", "_derived", "_pointers", "_values", "address")
    _DERIVED_CAPACITY = 8

    def __init__(self, values: Sequence[bytes | ctypes._SimpleCData]) -> None:
        self._values = tuple(values)
        offsets: list[int] = []
        blobs: list[bytes] = []
        cursor = 0
        for value in values:
            blob = value if isinstance(value, bytes) else bytes(value)
            alignment = 64 if isinstance(value, bytes) else ctypes.sizeof(value)
            cursor = -(-cursor // alignment) * alignment
            offsets.append(cursor)
            blobs.append(blob)
            cursor += len(blob)
        # Over-allocate so the block itself can start on a 64-byte boundary.
        self._buffer = (ctypes.c_uint8 * (cursor + 64))()
        base = -(-ctypes.addressof(self._buffer) // 64) * 64
        for offset, blob in zip(offsets, blobs):
            ctypes.memmove(base + offset, blob, len(blob))
        self._pointers = (ctypes.c_void_p * len(values))(*(base + offset for offset in offsets))
        self.address = ctypes.addressof(self._pointers)
        self._derived: dict[tuple[int, int, int, int], PackedArgs] = {}

    @property
    def nbytes(self) -> int:
        """The parameter block's size in bytes (what the driver copies per launch)."""
        return len(self._buffer) - 64

    def replace(self, changes: dict[int, bytes | ctypes._SimpleCData]) -> PackedArgs:
        """A new packing with the arguments at the given positions replaced (this one is never mutated:
        launches may hold it)."""
        values = list(self._values)
        for index, value in changes.items():
            values[index] = value
        return PackedArgs(values)

    def with_pointers(self, first: int, first_value: int, second: int, second_value: int) -> PackedArgs:
        """This packing with two 64-bit pointer arguments replaced, memoized per value pair (a split-tail
        launch's per-stream workspace and counters: the same few pairs on every call)."""
        key = (first, first_value, second, second_value)
        derived = self._derived.get(key)
        if derived is None:
            if len(self._derived) >= self._DERIVED_CAPACITY:
                self._derived.clear()
            derived = self._derived[key] = self.replace({first: U64(first_value), second: U64(second_value)})
        return derived
