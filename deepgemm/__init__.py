"""deepgemm: FP8/BF16 GEMM kernels for NVIDIA Hopper (sm_90a), JIT-compiled with NVRTC."""

from deepgemm.api.backend import backend_for, supported
from deepgemm.api.gemm import precompile_fp8_gemm_nt
from deepgemm.api.grouped import get_m_alignment_for_contiguous_layout
from deepgemm.api.grouped_layout import check_grouped_layout
from deepgemm.api.launch import get_pdl, set_pdl
from deepgemm.api.layout import to_mn_major_tma_aligned
from deepgemm.api.quant import dequantize_per_block, dequantize_per_token_group
from deepgemm.nn import convert, precompile_model
from deepgemm.errors import (
    CacheError,
    CompileError,
    DeepGemmError,
    GraphCaptureError,
    GroupedLayoutError,
    LockTimeoutError,
    NotDifferentiableError,
    UnsupportedError,
)
from deepgemm.ops import (
    bf16_gemm_nn,
    bf16_gemm_nt,
    bf16_gemm_tn,
    bf16_gemm_tt,
    fp8_gemm_nt,
    fp8_linear,
    k_grouped_bf16_gemm_tn_contiguous,
    k_grouped_fp8_gemm_tn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nt_contiguous_psum,
    m_grouped_bf16_gemm_nt_masked,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_contiguous_psum,
    m_grouped_fp8_gemm_nt_masked,
    quantize_per_block,
    quantize_per_token_group,
    rope,
    rope_,
    silu_mul_quantize_per_token_group,
    softmax,
)
from deepgemm.utils import calc_diff, warn_removed_environment

__version__ = "0.1.0"

warn_removed_environment()

__all__ = [
    "CacheError",
    "CompileError",
    "DeepGemmError",
    "GraphCaptureError",
    "GroupedLayoutError",
    "LockTimeoutError",
    "NotDifferentiableError",
    "UnsupportedError",
    "backend_for",
    "bf16_gemm_nn",
    "bf16_gemm_nt",
    "bf16_gemm_tn",
    "bf16_gemm_tt",
    "calc_diff",
    "check_grouped_layout",
    "convert",
    "dequantize_per_block",
    "dequantize_per_token_group",
    "fp8_gemm_nt",
    "fp8_linear",
    "get_m_alignment_for_contiguous_layout",
    "get_pdl",
    "k_grouped_bf16_gemm_tn_contiguous",
    "k_grouped_fp8_gemm_tn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous_psum",
    "m_grouped_bf16_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous_psum",
    "m_grouped_fp8_gemm_nt_masked",
    "precompile_fp8_gemm_nt",
    "precompile_model",
    "quantize_per_block",
    "quantize_per_token_group",
    "rope",
    "rope_",
    "set_pdl",
    "silu_mul_quantize_per_token_group",
    "softmax",
    "supported",
    "to_mn_major_tma_aligned",
]
