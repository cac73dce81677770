"""``deepgemm bench --model``: the tensors every implementation shares, built once outside the timed region.

Seeded random BF16 weights (and their FP8 quantization, shared by the two FP8 implementations), the inputs of every
layer that reads no other layer's output, and the balanced routing's index tensors (the permutation of the routed
rows into each implementation's layout).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from deepgemm.analysis.gemms import MOE_EXPERTS, ROUTER, SHARED_EXPERTS
from deepgemm.analysis.models import ModelSpec
from deepgemm.api.grouped import get_m_alignment_for_contiguous_layout
from deepgemm.bench.block_layers import BlockLayer, BlockPlan, RoutingPlan
from deepgemm.ops import quantize_per_block
from deepgemm.utils import align_up, ceil_div

GROUP = 128  # FP8 scaling granularity: 1x128 activation groups, 128x128 weight blocks

_MOE_INPUTS = (ROUTER, SHARED_EXPERTS, MOE_EXPERTS)  # the layers that read the MoE layer's hidden state


@dataclass
class Routing:
    """The balanced routing's index tensors, and each implementation's layout of the routed rows."""

    plan: RoutingPlan
    token_of_row: torch.Tensor  # int64 [R]: the token each routed row copies, rows grouped by expert
    expert_of_row: torch.Tensor  # int64 [R]
    segments: tuple[tuple[int, int, int], ...]  # (expert, first row, rows) of every expert with rows
    offs: torch.Tensor  # int32 [E]: cumulative row ends (torch._grouped_mm)
    padded_dest: torch.Tensor  # int64 [R]: each routed row's row in the contiguous padded layout
    m_indices: torch.Tensor  # int32 [M_total]: expert of each padded row, -1 for padding
    masked_dest: torch.Tensor  # int64 [R]: each routed row's row in the masked layout viewed as [E * max_m, ...]
    masked_m: torch.Tensor  # int32 [E]

    @classmethod
    def build(cls, plan: RoutingPlan, device: torch.device | str) -> Routing:
        experts, top_k, counts = plan.experts, plan.top_k, plan.counts
        expert = torch.arange(plan.rows) % experts  # row r = t * top_k + j goes to expert r mod E
        order = torch.argsort(expert, stable=True)
        expert_sorted = expert[order]
        starts = [0]
        for count in counts[:-1]:
            starts.append(starts[-1] + count)
        align = get_m_alignment_for_contiguous_layout()
        padded_starts = [0]
        for count in counts[:-1]:
            padded_starts.append(padded_starts[-1] + align_up(count, align))
        within = torch.arange(plan.rows) - torch.tensor(starts)[expert_sorted]
        padded_dest = torch.tensor(padded_starts)[expert_sorted] + within
        m_indices = torch.full((plan.padded_rows,), -1, dtype=torch.int32)
        m_indices[padded_dest] = expert_sorted.to(torch.int32)
        counts_t = torch.tensor(counts, dtype=torch.int32)
        return cls(
            plan=plan, token_of_row=(order // top_k).to(device), expert_of_row=expert_sorted.to(device),
            segments=tuple((e, starts[e], counts[e]) for e in range(experts) if counts[e]),
            offs=torch.cumsum(counts_t, 0).to(torch.int32).to(device), padded_dest=padded_dest.to(device),
            m_indices=m_indices.to(device), masked_dest=(expert_sorted * plan.max_m + within).to(device),
            masked_m=counts_t.to(device))

    def compact(self, tokens: torch.Tensor) -> torch.Tensor:
        """[T, H] token rows -> [R, H] routed rows grouped by expert."""
        return tokens.index_select(0, self.token_of_row)


# -- weights -------------------------------------------------------------------------------------------------------

@dataclass
class ExpertWeights:
    name: str  # the module name, "moe.experts"
    gate_up: torch.Tensor  # bf16 [E, N1, H]
    down: torch.Tensor  # bf16 [E, H, I]
    gate_up_fp8: tuple[torch.Tensor, torch.Tensor]  # quantized once, shared by the two FP8 implementations
    down_fp8: tuple[torch.Tensor, torch.Tensor]


@dataclass
class BlockWeights:
    """Seeded random BF16 weights (normal, scaled by 1/sqrt(K): never zeros) every implementation is built from."""

    linear: dict[str, torch.Tensor]  # layer name -> bf16 [n, k] (the router included)
    experts: ExpertWeights | None
    gated: bool
    activation: str


def _quantize_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] -> (e4m3 [E, N, K], float32 [E, ceil(N/128), ceil(K/128)]) with per-expert 128x128 blocks."""
    experts, n, k = w.shape
    if n % GROUP == 0:  # no block straddles two experts: quantize them as one [E * N, K] matrix
        q, sf = quantize_per_block(w.reshape(experts * n, k), GROUP)
        return q.view(experts, n, k), sf.view(experts, n // GROUP, ceil_div(k, GROUP))
    pairs = [quantize_per_block(w[e], GROUP) for e in range(experts)]
    return torch.stack([q for q, _ in pairs]), torch.stack([sf for _, sf in pairs])


def make_weights(model: ModelSpec, plans: Iterable[BlockPlan], device: torch.device | str, seed: int) -> BlockWeights:
    """One weight per layer name over all ``plans`` (decode and prefill blocks may hold different layers)."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16).mul_(shape[-1] ** -0.5)

    linear: dict[str, torch.Tensor] = {}
    grouped: dict[str, BlockLayer] = {}
    for plan in plans:
        for layer in plan.layers:
            if layer.kind == "experts":
                grouped.setdefault(layer.name, layer)
            elif layer.name not in linear:
                linear[layer.name] = randn(layer.n, layer.k)
    experts = None
    if grouped:
        up = next(layer for layer in grouped.values() if layer.source is None)
        down = next(layer for layer in grouped.values() if layer.source is not None)
        with torch.no_grad():
            w_up, w_down = randn(up.experts, up.n, up.k), randn(down.experts, down.n, down.k)
            experts = ExpertWeights(up.module, w_up, w_down, _quantize_experts(w_up), _quantize_experts(w_down))
    return BlockWeights(linear, experts, model.gated_mlp, model.activation)


# -- inputs --------------------------------------------------------------------------------------------------------

@dataclass
class BlockInputs:
    """The same inputs for every implementation: one tensor per layer that reads no other layer's output; the MoE
    layers (router, shared experts, routed experts) read one hidden state."""

    tensors: dict[str, torch.Tensor]
    hidden: torch.Tensor | None  # [T, H], the MoE layers' input

    def of(self, layer: BlockLayer) -> torch.Tensor:
        if layer.category in _MOE_INPUTS and self.hidden is not None:
            return self.hidden
        return self.tensors[layer.name]


def make_inputs(plan: BlockPlan, device: torch.device | str, seed: int) -> BlockInputs:
    generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + plan.tokens)

    def randn(m: int, k: int) -> torch.Tensor:
        return torch.randn((m, k), generator=generator, device=device, dtype=torch.bfloat16)

    hidden = randn(plan.tokens, plan.model.hidden_size) if plan.routing is not None else None
    tensors = {layer.name: randn(layer.m, layer.k) for layer in plan.layers if layer.source is None
               and not (hidden is not None and layer.category in _MOE_INPUTS)}
    return BlockInputs(tensors, hidden)
