"""Arguments the kernels cannot take must raise ValueError on the GPU, naming the argument, before anything is
launched: K % 16 != 0, an A (or out) that starts off a 16-byte boundary, a transposed or column-strided out, rows
with a non-unit column stride or a row stride that is not a multiple of 16 bytes, a non-contiguous masked_m.
(The same calls on CPU tensors must raise the same: that half is in the CPU tests.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import deepgemm
from tests.gpu.checks import FP8, masked_operands
from tests.gpu.guard import GEMM_ENTRY
from tests.helpers import random_activations, random_grouped_weights, random_operands

pytestmark = [pytest.mark.gpu, pytest.mark.quick]

Call = Callable[[], object]


def _fp8(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(FP8)


def _ones(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, device="cuda")


def _shifted_fp8(*shape: int, offset: int = 1) -> torch.Tensor:
    """A contiguous FP8 tensor whose data starts `offset` bytes past a 16-byte boundary (a view into a larger
    allocation, as a slice of a packed buffer would be)."""
    numel = 1
    for size in shape:
        numel *= size
    storage = torch.empty(numel + 16, dtype=torch.uint8, device="cuda")
    view = storage[offset:offset + numel].view(FP8).view(*shape)
    assert view.data_ptr() % 16 == offset % 16
    return view


# ---------------------------------------------------------------- fp8_gemm_nt


def dense_k_not_multiple_of_16() -> tuple[Call, str]:
    m, n, k = 64, 256, 100
    a, b = (_fp8(m, k), _ones(m, 1)), (_fp8(n, k), _ones(2, 1))
    return lambda: deepgemm.fp8_gemm_nt(a, b), r"\bK\b"


def dense_a_one_byte_offset() -> tuple[Call, str]:
    a, b = random_operands(64, 256, 512, "cuda", seed=1)
    shifted = _shifted_fp8(64, 512)
    return lambda: deepgemm.fp8_gemm_nt((shifted, a[1]), b), r"'a\[0\]'"


def dense_out_offset_by_one_element() -> tuple[Call, str]:
    a, b = random_operands(64, 256, 512, "cuda", seed=2)
    storage = torch.empty(64 * 256 + 8, dtype=torch.bfloat16, device="cuda")
    out = storage[1:1 + 64 * 256].view(64, 256)  # 2 bytes past a 16-byte boundary
    return lambda: deepgemm.fp8_gemm_nt(a, b, out), "'out'"


def dense_transposed_out() -> tuple[Call, str]:
    a, b = random_operands(64, 256, 512, "cuda", seed=3)
    out = torch.empty(256, 64, dtype=torch.bfloat16, device="cuda").t()  # [64, 256], strides (1, 64)
    return lambda: deepgemm.fp8_gemm_nt(a, b, out), "'out'"


def dense_a_column_stride_2() -> tuple[Call, str]:
    a, b = random_operands(64, 256, 512, "cuda", seed=4)
    strided = torch.empty(64, 1024, dtype=FP8, device="cuda")[:, ::2]  # strides (1024, 2)
    return lambda: deepgemm.fp8_gemm_nt((strided, a[1]), b), r"'a\[0\]'"


def dense_a_row_stride_not_16_bytes() -> tuple[Call, str]:
    a, b = random_operands(64, 256, 512, "cuda", seed=5)
    rows = torch.empty(64, 520, dtype=FP8, device="cuda")[:, :512]  # rows 520 bytes apart
    return lambda: deepgemm.fp8_gemm_nt((rows, a[1]), b), r"'a\[0\]'"


def dense_b_row_stride_not_16_bytes() -> tuple[Call, str]:
    a, b = random_operands(64, 256, 512, "cuda", seed=6)
    rows = torch.empty(256, 520, dtype=FP8, device="cuda")[:, :512]
    return lambda: deepgemm.fp8_gemm_nt(a, (rows, b[1])), r"'b\[0\]'"


# ---------------------------------------------------------------- grouped (contiguous, psum, masked)


def contiguous_k_not_multiple_of_16() -> tuple[Call, str]:
    a = (_fp8(128, 100), _ones(128, 1))
    b = (_fp8(2, 256, 100), _ones(2, 2, 1))
    out = torch.empty(128, 256, dtype=torch.bfloat16, device="cuda")
    m_indices = torch.zeros(128, dtype=torch.int32, device="cuda")
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices), r"\bK\b"


def contiguous_a_one_byte_offset() -> tuple[Call, str]:
    a = random_activations(128, 512, "cuda", 7)
    b = random_grouped_weights(2, 256, 512, "cuda", 8)
    out = torch.empty(128, 256, dtype=torch.bfloat16, device="cuda")
    m_indices = torch.zeros(128, dtype=torch.int32, device="cuda")
    shifted = _shifted_fp8(128, 512)
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous((shifted, a[1]), b, out, m_indices), r"'a\[0\]'"


def contiguous_transposed_out() -> tuple[Call, str]:
    a = random_activations(128, 512, "cuda", 9)
    b = random_grouped_weights(2, 256, 512, "cuda", 10)
    out = torch.empty(256, 128, dtype=torch.bfloat16, device="cuda").t()
    m_indices = torch.zeros(128, dtype=torch.int32, device="cuda")
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices), "'out'"


def psum_transposed_out() -> tuple[Call, str]:
    a = random_activations(128, 512, "cuda", 11)
    b = random_grouped_weights(2, 256, 512, "cuda", 12)
    out = torch.empty(256, 128, dtype=torch.bfloat16, device="cuda").t()
    psum = torch.tensor([100, 100], dtype=torch.int32, device="cuda")
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, psum), "'out'"


def masked_k_not_multiple_of_16() -> tuple[Call, str]:
    a = (_fp8(2, 64, 100), _ones(2, 64, 1))
    b = (_fp8(2, 256, 100), _ones(2, 2, 1))
    out = torch.empty(2, 64, 256, dtype=torch.bfloat16, device="cuda")
    masked_m = torch.tensor([10, 64], dtype=torch.int32, device="cuda")
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, 32), r"\bK\b"


def masked_a_one_byte_offset() -> tuple[Call, str]:
    a, b = masked_operands(2, 64, 256, 512, seed=13)
    shifted = _shifted_fp8(2, 64, 512)
    out = torch.empty(2, 64, 256, dtype=torch.bfloat16, device="cuda")
    masked_m = torch.tensor([10, 64], dtype=torch.int32, device="cuda")
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_masked((shifted, a[1]), b, out, masked_m, 32), r"'a\[0\]'"


def masked_m_not_contiguous() -> tuple[Call, str]:
    a, b = masked_operands(4, 64, 256, 512, seed=14)
    out = torch.empty(4, 64, 256, dtype=torch.bfloat16, device="cuda")
    masked_m = torch.full((8,), 32, dtype=torch.int32, device="cuda")[::2]  # [4], stride 2
    assert not masked_m.is_contiguous()
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, 32), "'masked_m'"


# ---------------------------------------------------------------- k-grouped


def _kgrouped_operands(seed: int):  # noqa: ANN202
    gen = torch.Generator().manual_seed(seed)
    a = deepgemm.quantize_per_token_group(torch.randn(128, 256, generator=gen).to("cuda", torch.bfloat16))
    b = deepgemm.quantize_per_token_group(torch.randn(136, 256, generator=gen).to("cuda", torch.bfloat16))
    return a, b


def kgrouped_transposed_out() -> tuple[Call, str]:
    a, b = _kgrouped_operands(15)
    out = torch.empty(2, 136, 128, device="cuda").transpose(1, 2)  # [2, 128, 136], not contiguous
    return lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, [128, 128]), "'out'"


def kgrouped_a_one_byte_offset() -> tuple[Call, str]:
    a, b = _kgrouped_operands(16)
    shifted = _shifted_fp8(128, 256)
    out = torch.empty(2, 128, 136, device="cuda")
    return lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous((shifted, a[1]), b, out, [128, 128]), r"'a\[0\]'"


CASES: dict[str, Callable[[], tuple[Call, str]]] = {
    builder.__name__: builder for builder in (
        dense_k_not_multiple_of_16, dense_a_one_byte_offset, dense_out_offset_by_one_element, dense_transposed_out,
        dense_a_column_stride_2, dense_a_row_stride_not_16_bytes, dense_b_row_stride_not_16_bytes,
        contiguous_k_not_multiple_of_16, contiguous_a_one_byte_offset, contiguous_transposed_out,
        psum_transposed_out, masked_k_not_multiple_of_16, masked_a_one_byte_offset, masked_m_not_contiguous,
        kgrouped_transposed_out, kgrouped_a_one_byte_offset,
    )
}


@pytest.mark.parametrize("case", list(CASES))
def test_misaligned_call_raises_value_error_before_launch(case: str, gpu_guard) -> None:  # noqa: ANN001
    call, names = CASES[case]()
    torch.cuda.synchronize()
    before = gpu_guard.launches(GEMM_ENTRY)
    with pytest.raises(ValueError, match=names):
        call()
    torch.cuda.synchronize()  # a launch that slipped through would fail here, or in the next test, not silently
    if gpu_guard.counting_launches:
        assert gpu_guard.launches(GEMM_ENTRY) == before, "a GEMM kernel was launched for a rejected call"
