"""`Fp8TrainingLinear`: nn.Linear whose forward and backward GEMMs run in FP8 (deepgemm.fp8_linear)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from deepgemm.ops.fp8_linear import ALIGNMENT, fp8_linear


class Fp8TrainingGemm(NamedTuple):
    """The GEMM shape a layer trained through fp8_linear runs (what precompile_model plans): its weight [out_features,
    in_features] in weight_dtype, and its output's dtype (None: the input's)."""

    out_features: int
    in_features: int
    weight_dtype: torch.dtype
    out_dtype: torch.dtype | None = None


class Fp8TrainingLinear(nn.Linear):
    """nn.Linear trained through FP8 GEMMs: the same `weight` and `bias` parameters (your dtype: the optimizer's
    master copy), the same state_dict, and `deepgemm.fp8_linear` as its forward, so Fprop, Dgrad and Wgrad each run
    one FP8 GEMM on e4m3 operands quantized per call (activations and gradients per 1x128 group, weights per
    128x128 block), with FP32 accumulation.

    Build one like nn.Linear, or wrap an existing layer with `from_linear` (sharing its parameters, so an optimizer
    built before keeps working); `deepgemm.convert(model, training=True)` does that for a whole model.

    Args:
        in_features / out_features: as nn.Linear; both multiples of 16 (the FP8 GEMMs' reduction dimensions).
        bias, device, dtype: as nn.Linear.

    Raises:
        ValueError: in_features or out_features is not a multiple of 16 (keep such a layer an nn.Linear); in a
            call, what fp8_linear raises.

    Example::

        from deepgemm.nn import Fp8TrainingLinear

        layer = Fp8TrainingLinear(7168, 2048, bias=False, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        layer(x).sum().backward()                # layer.weight.grad bfloat16 [2048, 7168]
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        _require_aligned(in_features, out_features)
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8TrainingLinear:
        """A new layer holding `linear`'s own weight and bias Parameter objects (nothing copied or quantized)."""
        _require_aligned(linear.in_features, linear.out_features)
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, device="meta")
        layer.weight = linear.weight
        layer.bias = linear.bias
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.bias)

    def fp8_training_gemm(self) -> Fp8TrainingGemm:
        """The GEMM shape this layer trains with (precompile_model plans its kernels)."""
        return Fp8TrainingGemm(self.out_features, self.in_features, self.weight.dtype)


def _require_aligned(in_features: int, out_features: int) -> None:
    for name, size in (("in_features", in_features), ("out_features", out_features)):
        if isinstance(size, int) and size % ALIGNMENT:
            raise ValueError(f"Fp8TrainingLinear: '{name}'={size} must be a multiple of {ALIGNMENT} (the FP8 GEMMs "
                             "read it as a reduction dimension in 16-byte rows); keep this layer an nn.Linear")
