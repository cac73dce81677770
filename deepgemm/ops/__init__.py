"""torch.library custom ops (`torch.ops.deepgemm.*`) and the public functions that route through them when traced.

Importing this package registers the ops. Eager calls of the public functions go straight to deepgemm.api (host
time); under torch.compile they become graph nodes with fake kernels, so Dynamo never traces our host code.
"""

from deepgemm.ops.bf16 import bf16_gemm_nn, bf16_gemm_nt, bf16_gemm_tn, bf16_gemm_tt
from deepgemm.ops.bf16_grouped import (
    k_grouped_bf16_gemm_tn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nt_contiguous_psum,
    m_grouped_bf16_gemm_nt_masked,
)
from deepgemm.ops.fp8_linear import fp8_linear
from deepgemm.ops.gemm import fp8_gemm_nt
from deepgemm.ops.grouped import (
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_contiguous_psum,
    m_grouped_fp8_gemm_nt_masked,
)
from deepgemm.ops.kgrouped import k_grouped_fp8_gemm_tn_contiguous
from deepgemm.ops.quant import quantize_per_block, quantize_per_token_group, silu_mul_quantize_per_token_group
from deepgemm.ops.rope import rope, rope_
from deepgemm.ops.softmax import softmax

__all__ = [
    "bf16_gemm_nn",
    "bf16_gemm_nt",
    "bf16_gemm_tn",
    "bf16_gemm_tt",
    "fp8_gemm_nt",
    "fp8_linear",
    "k_grouped_bf16_gemm_tn_contiguous",
    "k_grouped_fp8_gemm_tn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous_psum",
    "m_grouped_bf16_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous_psum",
    "m_grouped_fp8_gemm_nt_masked",
    "quantize_per_block",
    "quantize_per_token_group",
    "rope",
    "rope_",
    "silu_mul_quantize_per_token_group",
    "softmax",
]
