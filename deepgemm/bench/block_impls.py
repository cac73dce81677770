"""``deepgemm bench --model``: the implementations of the block, each its modules for every layer, built from the
same weights.

- ``deepgemm``: ``deepgemm.nn.Fp8Linear`` per linear layer (its ``route`` may send a small layer to a BF16 matmul of
  the dequantized weight; the report says which path each layer took), and ``DeepgemmExperts``: the routed
  tokens quantized with ``quantize_per_token_group``, ``m_grouped_fp8_gemm_nt_masked`` (decode, as engines run it
  under CUDA graphs) or ``m_grouped_fp8_gemm_nt_contiguous`` (prefill) for gate/up, SiLU*mul, re-quantization, down.
- ``cublas-bf16``: ``nn.Linear`` in BF16 (cuBLAS); experts through ``torch._grouped_mm`` in BF16.
- ``cublas-blockwise``: ``CublasBlockwiseLinear`` (cuBLAS block-wise FP8 through ``F.scaled_mm``, 1x128 / 128x128
  scales, activations quantized with ``quantize_per_token_group`` as for deepgemm); experts: a loop over experts.

The router is the same BF16 ``nn.Linear`` in every implementation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from deepgemm.bench.block_layers import BlockLayer, BlockPlan
from deepgemm.bench.block_modules import (
    Bf16GroupedExperts, CublasBlockwiseExperts, CublasBlockwiseLinear, DeepgemmExperts, activate, bf16_linear,
)
from deepgemm.bench.block_tensors import BlockInputs, BlockWeights, ExpertWeights, Routing
from deepgemm.nn import Fp8Linear

DEEPGEMM = "deepgemm"
BF16 = "cublas-bf16"
BLOCKWISE = "cublas-blockwise"
IMPLEMENTATIONS: dict[str, str] = {
    DEEPGEMM: "deepgemm.nn.Fp8Linear; experts: quantize_per_token_group (gate_up) or "
              "silu_mul_quantize_per_token_group (down, the activation fused) + m_grouped_fp8_gemm_nt_masked (decode) "
              "or _contiguous (prefill)",
    BF16: "BF16 nn.Linear (cuBLAS); experts: torch._grouped_mm in BF16",
    BLOCKWISE: "cuBLAS block-wise FP8 (F.scaled_mm, 1x128 / 128x128 scales, activations quantized by "
               "deepgemm.quantize_per_token_group); experts: a loop over experts",
}
SKIPPABLE = (BF16, BLOCKWISE)


def _identity(out: Any) -> Any:
    return out


@dataclass
class Step:
    """One layer of one implementation: ``fn`` on ``input`` (or on the output of ``layer.source``)."""

    layer: BlockLayer
    fn: Callable[[Any], Any]
    input: Any = None
    rows: Callable[[Any], torch.Tensor] = _identity  # the output's rows in token / routing order


class BlockImplementation:
    """One implementation's modules for every layer of the block, built once and reused at every token count."""

    name = ""

    def __init__(self, weights: BlockWeights, routers: dict[str, nn.Linear]) -> None:
        self.weights = weights
        self.modules: dict[str, nn.Module] = {}
        for name, w in weights.linear.items():
            self.modules[name] = routers[name] if name in routers else self.linear(bf16_linear(w))
        if weights.experts is not None:
            self.modules[weights.experts.name] = self.grouped(weights.experts)

    def linear(self, linear: nn.Linear) -> nn.Module:
        raise NotImplementedError

    def grouped(self, experts: ExpertWeights) -> nn.Module:
        raise NotImplementedError

    def backend(self, layer: BlockLayer) -> str:
        return "bf16"

    def steps(self, plan: BlockPlan, routing: Routing | None, inputs: BlockInputs) -> list[Step]:
        """The block's layers in order; the experts' inputs are dispatched into this implementation's layout here,
        outside the timed region."""
        steps: list[Step] = []
        layouts: dict[str, Any] = {}
        gated, activation = self.weights.gated, self.weights.activation
        for layer in plan.layers:
            module: Any = self.modules[layer.module]
            if layer.kind == "experts":
                if routing is None:
                    raise ValueError(f"{layer.name}: a grouped layer needs the block's routing")
                if layer.module not in layouts:
                    layouts[layer.module] = module.layout(routing)
                layout = layouts[layer.module]
                rows = functools.partial(module.routed_rows, layout=layout)
                if layer.source is None:
                    steps.append(Step(layer, functools.partial(module.gate_up, layout=layout),
                                      module.dispatch(inputs.of(layer), layout), rows))
                else:
                    steps.append(Step(layer, functools.partial(module.down, layout=layout), None, rows))
            elif layer.source is None:
                steps.append(Step(layer, module, inputs.of(layer)))
            else:
                steps.append(Step(layer, _after_activation(module, gated, activation)))
        return steps


def _after_activation(module: nn.Module, gated: bool, activation: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(h: torch.Tensor) -> torch.Tensor:
        return module(activate(h, gated=gated, activation=activation))

    return run


class DeepgemmBlock(BlockImplementation):
    name = DEEPGEMM

    def linear(self, linear: nn.Linear) -> nn.Module:
        return Fp8Linear.from_linear(linear, dtype=torch.bfloat16)

    def grouped(self, experts: ExpertWeights) -> nn.Module:
        return DeepgemmExperts(experts.gate_up_fp8, experts.down_fp8, gated=self.weights.gated,
                               activation=self.weights.activation)

    def backend(self, layer: BlockLayer) -> str:
        module = self.modules[layer.module]
        if isinstance(module, Fp8Linear):
            return module.backend(layer.m)
        if isinstance(module, DeepgemmExperts):
            return module.backend
        return "bf16"


class Bf16Block(BlockImplementation):
    name = BF16

    def linear(self, linear: nn.Linear) -> nn.Module:
        return linear

    def grouped(self, experts: ExpertWeights) -> nn.Module:
        return Bf16GroupedExperts(experts.gate_up, experts.down, gated=self.weights.gated,
                                  activation=self.weights.activation)


class CublasBlockwiseBlock(BlockImplementation):
    name = BLOCKWISE

    def linear(self, linear: nn.Linear) -> nn.Module:
        return CublasBlockwiseLinear.from_linear(linear)

    def grouped(self, experts: ExpertWeights) -> nn.Module:
        return CublasBlockwiseExperts(experts.gate_up_fp8, experts.down_fp8, gated=self.weights.gated,
                                      activation=self.weights.activation)


BUILDERS: dict[str, type[BlockImplementation]] = {DEEPGEMM: DeepgemmBlock, BF16: Bf16Block,
                                                  BLOCKWISE: CublasBlockwiseBlock}


def build_implementations(weights: BlockWeights, names: Sequence[str]) -> list[BlockImplementation]:
    """The named implementations, sharing one BF16 router module."""
    with torch.no_grad():
        routers = {name: bf16_linear(w) for name, w in weights.linear.items() if name.endswith("router")}
        return [BUILDERS[name](weights, routers) for name in names]
