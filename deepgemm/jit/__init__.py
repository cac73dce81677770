"""JIT layer: compile kernel sources to sm_90a cubins, cached on disk."""

from deepgemm.jit.compiler import (
    CompiledKernel,
    CompileStats,
    KernelSource,
    Outcome,
    compile_kernel,
    compile_kernel_outcome,
    compile_stats,
    compiler_choice,
    default_cache_dir,
    include_dir,
)
from deepgemm.jit.resources import PtxasResources, parse_ptxas_log

__all__ = [
    "CompiledKernel",
    "CompileStats",
    "KernelSource",
    "Outcome",
    "PtxasResources",
    "compile_kernel",
    "compile_kernel_outcome",
    "compile_stats",
    "compiler_choice",
    "default_cache_dir",
    "include_dir",
    "parse_ptxas_log",
]
