"""BF16 GEMM in every layout (impls/sm90_bf16_gemm.cuh): config, cost model, compiled spec, launch plans."""
