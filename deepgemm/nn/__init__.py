"""PyTorch modules on deepgemm's kernels: Fp8Linear, model conversion, FP8 checkpoint loading, precompiling."""

from deepgemm.nn.convert import ConversionReport, convert
from deepgemm.nn.checkpoint import LoadReport, load_fp8_checkpoint, save_fp8_checkpoint
from deepgemm.nn.linear import Fp8Linear
from deepgemm.nn.precompile import PrecompileSummary, precompile_model
from deepgemm.nn.training import Fp8TrainingLinear

__all__ = [
    "ConversionReport",
    "Fp8Linear",
    "Fp8TrainingLinear",
    "LoadReport",
    "PrecompileSummary",
    "convert",
    "load_fp8_checkpoint",
    "precompile_model",
    "save_fp8_checkpoint",
]
