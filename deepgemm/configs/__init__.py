from deepgemm.configs.config import GemmConfig
from deepgemm.configs.heuristics import choose_fp8_gemm_config, fp8_gemm_smem_bytes

__all__ = ["GemmConfig", "choose_fp8_gemm_config", "fp8_gemm_smem_bytes"]
