"""``deepgemm bench --model``: the PyTorch modules the block's implementations are made of.

- ``CublasBlockwiseLinear``: cuBLAS block-wise FP8 through ``F.scaled_mm`` (the ``cublas-blockwise`` linear layers).
- The routed experts, one module per implementation: ``DeepgemmExperts`` (deepgemm's grouped FP8 kernels, masked or
  contiguous form), ``Bf16GroupedExperts`` (``torch._grouped_mm``), ``CublasBlockwiseExperts`` (a loop over experts).
  Each has the same methods: ``layout`` (its view of a routing, made once), ``dispatch`` (token rows -> its gate/up
  input, outside the timed region), ``gate_up``, ``down`` (the activation, then the down GEMM) and ``routed_rows``
  (either stage's output as [R, N] rows in routing order, for the accuracy check).
- ``activate``: the MLP activation between two GEMMs, the same torch code for every implementation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from deepgemm.analysis.models import SILU_ACTIVATIONS
from deepgemm.api.backend import backend_for
from deepgemm.bench.block_layers import MoeForm
from deepgemm.bench.block_tensors import GROUP, Routing
from deepgemm.bench.peers import Unavailable
from deepgemm.ops import (
    m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked, quantize_per_block, quantize_per_token_group,
    silu_mul_quantize_per_token_group,
)
from deepgemm.utils import align_up, ceil_div


def activate(h: torch.Tensor, *, gated: bool, activation: str) -> torch.Tensor:
    """The MLP activation between its two GEMMs: act(gate) * up for a gated MLP ([gate; up] along the last
    dimension, as a fused gate_up_proj holds them), else act(h). Same torch code for every implementation."""
    act = _activation_fn(activation)
    if not gated:
        return act(h)
    gate, up = h.chunk(2, dim=-1)
    return act(gate) * up


def _activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    name = name.lower()
    if name.startswith("gelu"):
        tanh = "tanh" in name or name in ("gelu_new", "gelu_fast")
        return functools.partial(F.gelu, approximate="tanh" if tanh else "none")
    if name == "relu":
        return F.relu
    return F.silu  # silu / swish, and anything else (the timing is the same elementwise pass)


def bf16_linear(weight: torch.Tensor) -> nn.Linear:
    """An nn.Linear (no bias) whose weight is ``weight`` itself (no copy, no gradient)."""
    n, k = weight.shape
    linear = nn.Linear(k, n, bias=False, device="meta", dtype=weight.dtype)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    return linear


class CublasBlockwiseLinear(nn.Module):
    """y = x W^T through cuBLAS block-wise FP8 (``F.scaled_mm`` with BlockWise1x128 activations and BlockWise128x128
    weights; ``torch._scaled_mm`` on a torch without it), x quantized per call by ``quantize_per_token_group`` (the
    same quantizer deepgemm uses). cuBLAS wants the activation scales with strides (1, M): the quantizer's M-major
    scales have strides (1, align(M, 4)), so they are copied when M % 4 != 0. cuBLAS refuses N % 16 != 0 and small M
    (on an H200 with torch 2.11: M = 1, 2, 3 and 5 refused, 4 and 64 accepted)."""

    weight: torch.Tensor
    weight_scale_inv: torch.Tensor

    def __init__(self, weight: torch.Tensor, scale_inv: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        # torch's cuBLAS path wants the 128x128 scales' K-blocks padded to a multiple of 4 ([ceil(N/128),
        # align(ceil(K/128), 4)], seen on an H200 with K = 768); the padding is never read.
        k_blocks = scale_inv.shape[1]
        if k_blocks % 4:
            padded = torch.ones((scale_inv.shape[0], align_up(k_blocks, 4)), dtype=scale_inv.dtype,
                                device=scale_inv.device)
            padded[:, :k_blocks] = scale_inv
            scale_inv = padded
        self.register_buffer("weight_scale_inv", scale_inv)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> CublasBlockwiseLinear:
        with torch.no_grad():
            q, sf = quantize_per_block(linear.weight.detach(), GROUP)
        return cls(q, sf)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        q, sf = quantize_per_token_group(rows, GROUP)
        m = rows.shape[0]
        if sf.stride() != (1, m):
            sf = sf.t().contiguous().t()
        if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
            y = F.scaled_mm(q, self.weight.t(), sf, F.ScalingType.BlockWise1x128, self.weight_scale_inv.t(),
                            F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)
        elif hasattr(torch, "_scaled_mm"):
            y = torch._scaled_mm(q, self.weight.t(), scale_a=sf, scale_b=self.weight_scale_inv.t(),
                                 out_dtype=torch.bfloat16)
        else:
            raise Unavailable(f"this torch ({torch.__version__}) has neither F.scaled_mm nor torch._scaled_mm")
        return y.reshape(*x.shape[:-1], self.out_features)


# -- the routed experts ------------------------------------------------------------------------------------------

@dataclass
class DeepgemmLayout:
    """DeepgemmExperts' view of one routing: the form, and for the masked form its scratch buffers (allocated once,
    outside the timed region, as an engine keeps them: the routed rows are quantized where they are and scattered
    into the [E, max_m, K] operand)."""

    routing: Routing
    form: MoeForm
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


class DeepgemmExperts(nn.Module):
    """The routed experts on deepgemm's grouped FP8 kernels, weights e4m3 with per-expert 128x128 block scales.

    ``gate_up``: quantize the routed rows (``quantize_per_token_group``), grouped GEMM with the [E, N1, H] weights.
    ``down``: the activation and re-quantization (one pass, ``silu_mul_quantize_per_token_group``, for a SiLU-gated
    MLP), grouped GEMM with the [E, H, I] weights. The contiguous form
    (prefill) reads the rows with each expert padded to ``get_m_alignment_for_contiguous_layout()`` rows and an
    expert index per row; the masked form (decode) reads [E, max_m, K] operands with a row count per expert, only the
    routed rows being quantized, activated and scattered into place.
    """

    gate_up_weight: torch.Tensor
    gate_up_scale_inv: torch.Tensor
    down_weight: torch.Tensor
    down_scale_inv: torch.Tensor

    def __init__(self, gate_up: tuple[torch.Tensor, torch.Tensor], down: tuple[torch.Tensor, torch.Tensor], *,
                 gated: bool = True, activation: str = "silu") -> None:
        super().__init__()
        self.register_buffer("gate_up_weight", gate_up[0])
        self.register_buffer("gate_up_scale_inv", gate_up[1])
        self.register_buffer("down_weight", down[0])
        self.register_buffer("down_scale_inv", down[1])
        self.gated, self.activation = gated, activation
        self.experts, self.hidden, self.intermediate = down[0].shape  # down weights are [E, H, I]

    @property
    def backend(self) -> str:
        return backend_for(self.gate_up_weight)

    def layout(self, routing: Routing, form: MoeForm | None = None) -> DeepgemmLayout:
        form = form or routing.plan.form
        layout = DeepgemmLayout(routing, form)
        if form == "masked":
            device, rows = self.gate_up_weight.device, self.experts * routing.plan.max_m
            for name, k in (("1", self.hidden), ("2", self.intermediate)):
                layout.buffers["a" + name] = torch.zeros((rows, k), dtype=torch.float8_e4m3fn, device=device)
                layout.buffers["sf" + name] = torch.ones((ceil_div(k, GROUP), rows), dtype=torch.float32,
                                                         device=device)
            for name, n in (("1", self.gate_up_weight.shape[1]), ("2", self.hidden)):
                layout.buffers["out" + name] = torch.zeros((self.experts, routing.plan.max_m, n), dtype=torch.bfloat16,
                                                           device=device)
        return layout

    def dispatch(self, tokens: torch.Tensor, layout: DeepgemmLayout) -> torch.Tensor:
        """Token rows [T, H] -> the gate_up input: the padded [M_total, H] layout (contiguous) or the routed rows
        [R, H] (masked: quantized, then scattered by ``gate_up``). Routing work, outside the timed region."""
        rows = layout.routing.compact(tokens)
        if layout.form == "masked":
            return rows
        padded = torch.zeros((layout.routing.plan.padded_rows, tokens.shape[1]), dtype=tokens.dtype,
                             device=tokens.device)
        padded[layout.routing.padded_dest] = rows
        return padded

    def gate_up(self, x: torch.Tensor, layout: DeepgemmLayout) -> torch.Tensor:
        return self._gemm(quantize_per_token_group(x, GROUP), layout, "1",
                          (self.gate_up_weight, self.gate_up_scale_inv))

    def down(self, mid: torch.Tensor, layout: DeepgemmLayout) -> torch.Tensor:
        if layout.form == "masked":
            mid = mid.reshape(-1, mid.shape[-1]).index_select(0, layout.routing.masked_dest)
        if self.gated and self.activation.lower() in SILU_ACTIVATIONS:  # one pass: SiLU * up, quantized
            quantized = silu_mul_quantize_per_token_group(mid, GROUP)
        else:
            quantized = quantize_per_token_group(activate(mid, gated=self.gated, activation=self.activation), GROUP)
        return self._gemm(quantized, layout, "2", (self.down_weight, self.down_scale_inv))

    def forward(self, x: torch.Tensor, layout: DeepgemmLayout) -> torch.Tensor:
        return self.down(self.gate_up(x, layout), layout)

    def _gemm(self, quantized: tuple[torch.Tensor, torch.Tensor], layout: DeepgemmLayout, which: str,
              b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, sf = quantized
        routing = layout.routing
        if layout.form == "contiguous":
            out = torch.empty((q.shape[0], b[0].shape[1]), dtype=torch.bfloat16, device=q.device)
            return m_grouped_fp8_gemm_nt_contiguous((q, sf), b, out, routing.m_indices)
        buffers, dest, max_m = layout.buffers, routing.masked_dest, routing.plan.max_m
        a, sfa, out = buffers["a" + which], buffers["sf" + which], buffers["out" + which]
        a.view(torch.uint8).index_copy_(0, dest, q.view(torch.uint8))  # index_copy_ has no float8 kernel
        sfa.index_copy_(1, dest, sf.t())
        k = a.shape[1]
        # [ceil(K/128), E * max_m] scales seen as [E, max_m, ceil(K/128)]: M-major, read in place by the kernel
        operand = (a.view(self.experts, max_m, k), sfa.t().view(self.experts, max_m, sfa.shape[0]))
        return m_grouped_fp8_gemm_nt_masked(operand, b, out, routing.masked_m, routing.plan.expected_m)

    def routed_rows(self, out: torch.Tensor, layout: DeepgemmLayout) -> torch.Tensor:
        """Either stage's output -> [R, N] in routing order."""
        dest = layout.routing.masked_dest if layout.form == "masked" else layout.routing.padded_dest
        return out.reshape(-1, out.shape[-1]).index_select(0, dest)


class Bf16GroupedExperts(nn.Module):
    """The routed experts in BF16 through ``torch._grouped_mm`` on the routed rows grouped by expert (no padding)."""

    gate_up_weight: torch.Tensor
    down_weight: torch.Tensor

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, *, gated: bool = True,
                 activation: str = "silu") -> None:
        super().__init__()
        self.register_buffer("gate_up_weight", gate_up)
        self.register_buffer("down_weight", down)
        self.gated, self.activation = gated, activation

    def layout(self, routing: Routing) -> Routing:
        return routing  # the routed rows grouped by expert, as the routing holds them

    def dispatch(self, tokens: torch.Tensor, layout: Routing) -> torch.Tensor:
        return layout.compact(tokens)

    def gate_up(self, x: torch.Tensor, layout: Routing) -> torch.Tensor:
        return self._grouped(x, self.gate_up_weight, layout)

    def down(self, mid: torch.Tensor, layout: Routing) -> torch.Tensor:
        return self._grouped(activate(mid, gated=self.gated, activation=self.activation), self.down_weight, layout)

    def forward(self, x: torch.Tensor, layout: Routing) -> torch.Tensor:
        return self.down(self.gate_up(x, layout), layout)

    @staticmethod
    def _grouped(x: torch.Tensor, w: torch.Tensor, routing: Routing) -> torch.Tensor:
        grouped_mm = getattr(torch, "_grouped_mm", None)
        if grouped_mm is None:
            raise Unavailable(f"this torch ({torch.__version__}) has no torch._grouped_mm")
        return grouped_mm(x, w.transpose(-2, -1), offs=routing.offs, out_dtype=torch.bfloat16)

    def routed_rows(self, out: torch.Tensor, layout: Routing) -> torch.Tensor:
        return out


class CublasBlockwiseExperts(nn.Module):
    """The routed experts as a loop over the experts with rows, each a pair of :class:`CublasBlockwiseLinear`."""

    def __init__(self, gate_up: tuple[torch.Tensor, torch.Tensor], down: tuple[torch.Tensor, torch.Tensor], *,
                 gated: bool = True, activation: str = "silu") -> None:
        super().__init__()
        self.gate_up_proj = nn.ModuleList(CublasBlockwiseLinear(gate_up[0][e], gate_up[1][e])
                                          for e in range(gate_up[0].shape[0]))
        self.down_proj = nn.ModuleList(CublasBlockwiseLinear(down[0][e], down[1][e]) for e in range(down[0].shape[0]))
        self.gated, self.activation = gated, activation

    def layout(self, routing: Routing) -> Routing:
        return routing  # the routed rows grouped by expert, as the routing holds them

    def dispatch(self, tokens: torch.Tensor, layout: Routing) -> torch.Tensor:
        return layout.compact(tokens)

    def gate_up(self, x: torch.Tensor, layout: Routing) -> list[torch.Tensor]:
        return [self.gate_up_proj[e](x[start:start + rows]) for e, start, rows in layout.segments]

    def down(self, mids: list[torch.Tensor], layout: Routing) -> list[torch.Tensor]:
        return [self.down_proj[e](activate(mid, gated=self.gated, activation=self.activation))
                for (e, _, _), mid in zip(layout.segments, mids)]

    def forward(self, x: torch.Tensor, layout: Routing) -> list[torch.Tensor]:
        return self.down(self.gate_up(x, layout), layout)

    def routed_rows(self, outs: list[torch.Tensor], layout: Routing) -> torch.Tensor:
        return torch.cat(outs)
