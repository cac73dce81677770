"""Host mirrors of include/deepgemm/elementwise/elements.cuh: the element kinds and the 16-byte vector rule the
element-wise kernels (quantizers, softmax, RoPE) share."""

from __future__ import annotations

import torch

ELEMENT_KINDS = {
    torch.float32: "deepgemm::InputKind::kFloat32",
    torch.bfloat16: "deepgemm::InputKind::kBFloat16",
    torch.float16: "deepgemm::InputKind::kFloat16",
}
VECTOR_BYTES = 16


def vector_elements(dtype: torch.dtype) -> int:
    """Elements of `dtype` in one 16-byte vector (kVectorElements)."""
    return VECTOR_BYTES // dtype.itemsize


def vector_aligned(t: torch.Tensor, *strides: int) -> bool:
    """t's base and each of the given element strides land on 16-byte boundaries."""
    size = t.element_size()
    return t.data_ptr() % VECTOR_BYTES == 0 and all((s * size) % VECTOR_BYTES == 0 for s in strides)
