"""k-grouped FP8 GEMM with 1x128 scales on both operands (impls/sm90_fp8_gemm_1d1d.cuh): the MoE expert weight gradient."""
