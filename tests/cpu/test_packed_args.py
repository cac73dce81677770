"""Packed kernel arguments: the byte layout cuLaunchKernelEx reads, and the memoized pointer variants."""

from __future__ import annotations

import ctypes

from deepgemm.jit.args import U32, U64, PackedArgs


def read_values(args: PackedArgs, sizes: list[int]) -> list[bytes]:
    pointers = ctypes.cast(args.address, ctypes.POINTER(ctypes.c_void_p))
    return [ctypes.string_at(pointers[i], size) for i, size in enumerate(sizes)]


def test_values_are_aligned_and_copied() -> None:
    descriptor = bytes(range(128))
    args = PackedArgs([U32(7), descriptor, U64(0x1234_5678_9ABC), U64(0)])
    pointers = ctypes.cast(args.address, ctypes.POINTER(ctypes.c_void_p))
    assert pointers[1] % 64 == 0 and pointers[2] % 8 == 0
    assert read_values(args, [4, 128, 8, 8]) == [bytes(U32(7)), descriptor, bytes(U64(0x1234_5678_9ABC)), bytes(8)]


def test_with_pointers_replaces_two_arguments_and_memoizes() -> None:
    base = PackedArgs([U32(1), U64(0), U64(0)])
    first = base.with_pointers(1, 0xAAAA0000, 2, 0xBBBB0000)
    assert read_values(first, [4, 8, 8]) == [bytes(U32(1)), bytes(U64(0xAAAA0000)), bytes(U64(0xBBBB0000))]
    assert read_values(base, [4, 8, 8]) == [bytes(U32(1)), bytes(8), bytes(8)]  # the original is never mutated
    assert base.with_pointers(1, 0xAAAA0000, 2, 0xBBBB0000) is first  # warm launches re-pack nothing
    other = base.with_pointers(1, 0xCCCC0000, 2, 0xBBBB0000)
    assert other is not first and read_values(other, [4, 8, 8])[1] == bytes(U64(0xCCCC0000))
    for value in range(20):  # bounded: past the capacity the memo starts over (graph captures make new pairs)
        assert read_values(base.with_pointers(1, value, 2, value), [4, 8, 8])[2] == bytes(U64(value))
    assert len(base._derived) <= PackedArgs._DERIVED_CAPACITY
