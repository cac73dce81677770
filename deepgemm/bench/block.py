"""``deepgemm bench --model``: one transformer block's linear layers as real PyTorch modules, per implementation.

A block is the model's layer kind that matters: for a mixture-of-experts model a MoE layer (attention projections,
the router, the routed experts and any shared experts), else a dense layer (attention projections, gate/up, down).
Its GEMMs come from ``deepgemm.analysis`` (``enumerate_gemms``: fused QKV and gate/up, MLA for DeepSeek); the
attention core, norms, embeddings and the LM head are not part of it.

Every implementation is built from the same seeded random BF16 weights and reads the same inputs:

- ``deepgemm``: ``deepgemm.nn.Fp8Linear`` per linear layer (its ``route`` may send a small layer to a BF16 matmul of
  the dequantized weight; the report says which path each layer took), and :class:`DeepgemmExperts`: the routed
  tokens quantized with ``quantize_per_token_group``, ``m_grouped_fp8_gemm_nt_masked`` (decode, as engines run it
  under CUDA graphs) or ``m_grouped_fp8_gemm_nt_contiguous`` (prefill) for gate/up, SiLU*mul, re-quantization, down.
- ``cublas-bf16``: ``nn.Linear`` in BF16 (cuBLAS); experts through ``torch._grouped_mm`` in BF16.
- ``cublas-blockwise``: :class:`CublasBlockwiseLinear` (cuBLAS block-wise FP8 through ``F.scaled_mm``, 1x128 / 128x128
  scales, activations quantized with ``quantize_per_token_group`` as for deepgemm); experts: a loop over experts.

The router is the same BF16 ``nn.Linear`` in every implementation. Routing is fixed and balanced (token t's j-th
expert is (t * top_k + j) mod E, so each expert gets tokens * top_k / E rows, as ``deepgemm.analysis`` assumes); the
permutation into each implementation's layout is done once, outside the timed region, and the combine back to token
order is not timed. Each implementation's whole block (its layers in sequence, the activation of each MLP between
its two GEMMs, under ``torch.inference_mode``) is one timed callable, and so is each layer on its own; both are
timed interleaved across implementations by ``deepgemm.tuning.timing.bench_gpu_interleaved`` (CUDA-graph replay,
L2 flushed before every sample, median).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import json
import torch
import torch.nn.functional as F
from torch import nn

from deepgemm.analysis.gemms import (
    ATTENTION_PROJ, DENSE_MLP, MOE_EXPERTS, ROUTER, SHARED_EXPERTS, Workload, enumerate_gemms,
)
from deepgemm.analysis.models import ModelSpec
from deepgemm.api.backend import backend_for
from deepgemm.api.grouped import MASKED_M_ALIGNMENT, get_m_alignment_for_contiguous_layout
from deepgemm.bench.peers import Unavailable
from deepgemm.bench.runner import environment as gpu_environment
from deepgemm.errors import UnsupportedError
from deepgemm.nn import Fp8Linear
from deepgemm.ops import (
    m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked, quantize_per_block, quantize_per_token_group,
)
from deepgemm.tuning.timing import FLUSH_BYTES, Timing, bench_gpu_interleaved
from deepgemm.utils import align_up, calc_diff, ceil_div

FORMAT = "deepgemm-bench-block"
VERSION = 1
GROUP = 128
DEFAULT_TOKENS = (1, 64, 4096)
# Token counts up to this are a decode step (that many sequences, one new token each: masked experts, absorbed MLA);
# above it, a prefill of one sequence (contiguous experts, MLA expands its latent with kv_b_proj). 128 is the largest
# batch engines commonly dispatch per rank in DeepEP's low-latency (masked, CUDA-graph) mode.
DECODE_MAX_TOKENS = 128
# calc_diff of an FP8 layer against the BF16 implementation's output of the same layer: FP8 rounding of both
# operands puts it near 1e-3 (a little more for a down projection, whose input carries its gate/up's error); a layout
# or indexing mistake gives ~1.
DIFF_LIMIT = 1e-2

DEEPGEMM = "deepgemm"
BF16 = "cublas-bf16"
BLOCKWISE = "cublas-blockwise"
IMPLEMENTATIONS: dict[str, str] = {
    DEEPGEMM: "deepgemm.nn.Fp8Linear; experts: quantize_per_token_group + m_grouped_fp8_gemm_nt_masked (decode) "
              "or _contiguous (prefill)",
    BF16: "BF16 nn.Linear (cuBLAS); experts: torch._grouped_mm in BF16",
    BLOCKWISE: "cuBLAS block-wise FP8 (F.scaled_mm, 1x128 / 128x128 scales, activations quantized by "
               "deepgemm.quantize_per_token_group); experts: a loop over experts",
}
SKIPPABLE = (BF16, BLOCKWISE)

Phase = Literal["prefill", "decode"]
MoeForm = Literal["masked", "contiguous"]
Status = Literal["ok", "refused", "n/a", "error"]
Progress = Callable[[Sequence[int], str, Callable[[int], str]], Iterator[int]]


# -- the block's layers (no GPU needed) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class BlockLayer:
    """One GEMM of the block: ``m`` rows (all routed rows for the experts) by an [n, k] weight."""

    name: str  # as deepgemm.analysis names it, e.g. "attn.qkv_proj", "moe.experts.down_proj"
    category: str
    m: int
    n: int
    k: int
    experts: int = 0  # weight matrices of a grouped layer (all experts); 0 for a dense layer
    active_experts: int = 0  # experts that receive rows
    source: str | None = None  # the layer whose output (through the activation) this one reads

    @property
    def kind(self) -> Literal["linear", "router", "experts"]:
        if self.category == ROUTER:
            return "router"
        return "experts" if self.category == MOE_EXPERTS else "linear"

    @property
    def module(self) -> str:
        """The module that holds this layer's weight: the experts' two GEMMs share one."""
        return self.name.rsplit(".", 1)[0] if self.kind == "experts" else self.name

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.m, self.n, self.k

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def label(self) -> str:
        """A short name for tables."""
        return (self.name.replace("moe.shared_experts.", "shared.").replace("moe.experts.", "experts.")
                .replace("attn.q_a_proj+kv_a_proj", "attn.q_a+kv_a_proj"))


@dataclass(frozen=True)
class RoutingPlan:
    """Fixed balanced routing: token t's j-th expert is (t * top_k + j) mod experts."""

    tokens: int
    experts: int
    top_k: int
    form: MoeForm  # the layout deepgemm's grouped kernels read

    @property
    def rows(self) -> int:
        return self.tokens * self.top_k

    @property
    def counts(self) -> tuple[int, ...]:
        """Routed rows per expert (they differ by at most one)."""
        base, extra = divmod(self.rows, self.experts)
        return tuple(base + (1 if e < extra else 0) for e in range(self.experts))

    @property
    def active_experts(self) -> int:
        return min(self.experts, self.rows)

    @property
    def alignment(self) -> int:
        return get_m_alignment_for_contiguous_layout() if self.form == "contiguous" else MASKED_M_ALIGNMENT

    @property
    def padded_rows(self) -> int:
        """M_total of the contiguous layout: each expert's rows padded to the alignment."""
        align = get_m_alignment_for_contiguous_layout()
        return sum(align_up(count, align) for count in self.counts)

    @property
    def max_m(self) -> int:
        """Rows per expert of the masked layout: the token count rounded up to a multiple of 64, as engines size it
        (any expert may receive every token: DeepEP's low-latency receive buffers)."""
        return align_up(self.tokens, MASKED_M_ALIGNMENT)

    @property
    def expected_m(self) -> int:
        """The masked kernel's tile-choice hint, as DeepEP-based engines pass it: (rows + experts) // experts."""
        return (self.rows + self.experts) // self.experts

    @property
    def kernel_rows(self) -> int:
        """Rows deepgemm's grouped kernels are given (useful and padding)."""
        return self.padded_rows if self.form == "contiguous" else self.experts * self.max_m

    def expert_of(self, token: int, slot: int) -> int:
        return (token * self.top_k + slot) % self.experts

    def describe(self) -> str:
        counts = sorted(set(self.counts))
        per = "-".join(str(c) for c in (counts[0], counts[-1])) if len(counts) > 1 else str(counts[0])
        layout = (f"masked layout, max_m = {self.max_m} rows per expert, expected_m = {self.expected_m}"
                  if self.form == "masked"
                  else f"contiguous layout, each expert padded to {self.alignment} rows: M_total = {self.padded_rows}")
        return (f"{self.rows} routed rows (top-{self.top_k}) over {self.experts} experts, {per} per expert "
                f"({self.active_experts} with rows); deepgemm: {layout}")


@dataclass(frozen=True)
class BlockPlan:
    model: ModelSpec
    tokens: int
    phase: Phase
    layers: tuple[BlockLayer, ...]
    routing: RoutingPlan | None  # None for a dense block

    @property
    def kind(self) -> str:
        return "MoE" if self.routing is not None else "dense"

    def layer(self, name: str) -> BlockLayer:
        return next(layer for layer in self.layers if layer.name == name)


def phase_for(tokens: int) -> Phase:
    return "decode" if tokens <= DECODE_MAX_TOKENS else "prefill"


def is_moe_block(model: ModelSpec) -> bool:
    return model.moe is not None and model.num_moe_layers > 0


def block_plan(model: ModelSpec, tokens: int) -> BlockPlan:
    """The block's linear layers at ``tokens`` tokens, from ``deepgemm.analysis.enumerate_gemms``: a decode step of
    ``tokens`` sequences up to DECODE_MAX_TOKENS, else a prefill of one ``tokens``-token sequence."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"argument --tokens: token counts must be positive integers, got {tokens!r}")
    phase = phase_for(tokens)
    workload = (Workload(batch=tokens, seq=1, decode_tokens=1, include_prefill=False) if phase == "decode"
                else Workload(batch=1, seq=tokens))
    moe = is_moe_block(model)
    wanted = {ATTENTION_PROJ, ROUTER, MOE_EXPERTS, SHARED_EXPERTS} if moe else {ATTENTION_PROJ, DENSE_MLP}
    layers: list[BlockLayer] = []
    for op in enumerate_gemms(model, workload):
        if op.category not in wanted or op.pass_ != "forward" or op.kind == "batched":
            continue
        source = None
        if op.name.endswith(".down_proj"):
            prefix = op.name.removesuffix("down_proj")
            source = next((layer.name for layer in reversed(layers) if layer.name.startswith(prefix)), None)
        experts = model.moe.num_experts if op.category == MOE_EXPERTS and model.moe is not None else 0
        layers.append(BlockLayer(op.name, op.category, op.m, op.n, op.k, experts, op.groups if experts else 0, source))
    routing = None
    if moe and model.moe is not None:
        routing = RoutingPlan(tokens, model.moe.num_experts, model.moe.experts_per_token,
                              "masked" if phase == "decode" else "contiguous")
    return BlockPlan(model, tokens, phase, tuple(layers), routing)


def parse_tokens(text: str) -> tuple[int, ...]:
    """"1,64,4096" -> (1, 64, 4096) (order kept, duplicates dropped); ValueError naming the bad item."""
    values: list[int] = []
    for item in text.replace(" ", "").split(","):
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"expected comma-separated positive integers, got {text!r}") from None
        if value < 1:
            raise ValueError(f"token counts must be >= 1, got {value} in {text!r}")
        values.append(value)
    return tuple(dict.fromkeys(values))


# -- routing (the same for every implementation, built once per token count, outside the timed region) -----------

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


# -- modules -------------------------------------------------------------------------------------------------------

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


def _quantize_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] -> (e4m3 [E, N, K], float32 [E, ceil(N/128), ceil(K/128)]) with per-expert 128x128 blocks."""
    experts, n, k = w.shape
    if n % GROUP == 0:
        q, sf = quantize_per_block(w.reshape(experts * n, k), GROUP)
        return q.view(experts, n, k), sf.view(experts, n // GROUP, ceil_div(k, GROUP))
    pairs = [quantize_per_block(w[e], GROUP) for e in range(experts)]
    return torch.stack([q for q, _ in pairs]), torch.stack([sf for _, sf in pairs])


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
    ``down``: the activation, re-quantization, grouped GEMM with the [E, H, I] weights. The contiguous form
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
        self.experts, self.intermediate, self.hidden = down[0].shape[0], down[0].shape[2], down[0].shape[1]

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
        return self._gemm(x, layout, "1", (self.gate_up_weight, self.gate_up_scale_inv))

    def down(self, mid: torch.Tensor, layout: DeepgemmLayout) -> torch.Tensor:
        if layout.form == "masked":
            mid = mid.reshape(-1, mid.shape[-1]).index_select(0, layout.routing.masked_dest)
        h = activate(mid, gated=self.gated, activation=self.activation)
        return self._gemm(h, layout, "2", (self.down_weight, self.down_scale_inv))

    def forward(self, x: torch.Tensor, layout: DeepgemmLayout) -> torch.Tensor:
        return self.down(self.gate_up(x, layout), layout)

    def _gemm(self, x: torch.Tensor, layout: DeepgemmLayout, which: str,
              b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, sf = quantize_per_token_group(x, GROUP)
        routing = layout.routing
        if layout.form == "contiguous":
            out = torch.empty((x.shape[0], b[0].shape[1]), dtype=torch.bfloat16, device=x.device)
            return m_grouped_fp8_gemm_nt_contiguous((q, sf), b, out, routing.m_indices)
        buffers, dest, max_m = layout.buffers, routing.masked_dest, routing.plan.max_m
        a, sfa, out = buffers["a" + which], buffers["sf" + which], buffers["out" + which]
        a.view(torch.uint8).index_copy_(0, dest, q.view(torch.uint8))
        sfa.index_copy_(1, dest, sf.t())
        k = a.shape[1]
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
        return routing

    def dispatch(self, tokens: torch.Tensor, routing: Routing) -> torch.Tensor:
        return routing.compact(tokens)

    def gate_up(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        return self._grouped(x, self.gate_up_weight, routing)

    def down(self, mid: torch.Tensor, routing: Routing) -> torch.Tensor:
        return self._grouped(activate(mid, gated=self.gated, activation=self.activation), self.down_weight, routing)

    def forward(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        return self.down(self.gate_up(x, routing), routing)

    @staticmethod
    def _grouped(x: torch.Tensor, w: torch.Tensor, routing: Routing) -> torch.Tensor:
        grouped_mm = getattr(torch, "_grouped_mm", None)
        if grouped_mm is None:
            raise Unavailable(f"this torch ({torch.__version__}) has no torch._grouped_mm")
        return grouped_mm(x, w.transpose(-2, -1), offs=routing.offs, out_dtype=torch.bfloat16)

    def routed_rows(self, out: torch.Tensor, routing: Routing) -> torch.Tensor:
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
        return routing

    def dispatch(self, tokens: torch.Tensor, routing: Routing) -> torch.Tensor:
        return routing.compact(tokens)

    def gate_up(self, x: torch.Tensor, routing: Routing) -> list[torch.Tensor]:
        return [self.gate_up_proj[e](x[start:start + rows]) for e, start, rows in routing.segments]

    def down(self, mids: list[torch.Tensor], routing: Routing) -> list[torch.Tensor]:
        return [self.down_proj[e](activate(mid, gated=self.gated, activation=self.activation))
                for (e, _, _), mid in zip(routing.segments, mids)]

    def forward(self, x: torch.Tensor, routing: Routing) -> list[torch.Tensor]:
        return self.down(self.gate_up(x, routing), routing)

    def routed_rows(self, outs: list[torch.Tensor], routing: Routing) -> torch.Tensor:
        return torch.cat(outs)


# -- weights and inputs --------------------------------------------------------------------------------------------

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


def make_weights(model: ModelSpec, plans: Iterable[BlockPlan], device: torch.device | str, seed: int) -> BlockWeights:
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


@dataclass
class BlockInputs:
    """The same inputs for every implementation: one tensor per layer that reads no other layer's output; the MoE
    layers (router, shared experts, routed experts) read one hidden state."""

    tensors: dict[str, torch.Tensor]
    hidden: torch.Tensor | None  # [T, H], the MoE layers' input

    def of(self, layer: BlockLayer) -> torch.Tensor:
        if layer.category in (ROUTER, SHARED_EXPERTS, MOE_EXPERTS) and self.hidden is not None:
            return self.hidden
        return self.tensors[layer.name]


def make_inputs(plan: BlockPlan, device: torch.device | str, seed: int) -> BlockInputs:
    generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + plan.tokens)

    def randn(m: int, k: int) -> torch.Tensor:
        return torch.randn((m, k), generator=generator, device=device, dtype=torch.bfloat16)

    hidden = randn(plan.tokens, plan.model.hidden_size) if plan.routing is not None else None
    tensors = {layer.name: randn(layer.m, layer.k) for layer in plan.layers if layer.source is None
               and not (hidden is not None and layer.category in (ROUTER, SHARED_EXPERTS, MOE_EXPERTS))}
    return BlockInputs(tensors, hidden)


# -- implementations -----------------------------------------------------------------------------------------------

@dataclass
class Step:
    """One layer of one implementation: ``fn`` on ``input`` (or on the output of ``layer.source``)."""

    layer: BlockLayer
    fn: Callable[[Any], Any]
    input: Any = None
    rows: Callable[[Any], torch.Tensor] = lambda out: out  # the output's rows in token / routing order


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
        steps: list[Step] = []
        layouts: dict[str, Any] = {}
        gated, activation = self.weights.gated, self.weights.activation
        for layer in plan.layers:
            module: Any = self.modules[layer.module]
            if layer.kind == "experts":
                assert routing is not None
                if layer.module not in layouts:
                    layouts[layer.module] = module.layout(routing)
                layout = layouts[layer.module]
                rows = functools.partial(module.routed_rows, **{_layout_arg(module): layout})
                if layer.source is None:
                    steps.append(Step(layer, functools.partial(module.gate_up, **{_layout_arg(module): layout}),
                                      module.dispatch(inputs.of(layer), layout), rows))
                else:
                    steps.append(Step(layer, functools.partial(module.down, **{_layout_arg(module): layout}), None,
                                      rows))
            elif layer.source is None:
                steps.append(Step(layer, module, inputs.of(layer)))
            else:
                steps.append(Step(layer, _after_activation(module, gated, activation)))
        return steps


def _layout_arg(module: nn.Module) -> str:
    return "layout" if isinstance(module, DeepgemmExperts) else "routing"


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
    with torch.no_grad():
        routers = {name: bf16_linear(w) for name, w in weights.linear.items() if name.endswith("router")}
        return [BUILDERS[name](weights, routers) for name in names]


# -- results -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timed:
    """One implementation's timing of one callable (a block or a layer), or why there is none."""

    status: Status
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    min_us: float | None = None
    samples: int = 0
    cuda_graph: bool | None = None
    calc_diff: float | None = None  # against the BF16 implementation's output of the same layer
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.median_us is not None

    @property
    def accurate(self) -> bool:
        return self.calc_diff is None or self.calc_diff <= DIFF_LIMIT

    @classmethod
    def from_timing(cls, timing: Timing, calc_diff: float | None = None) -> Timed:
        return cls("ok", timing.median_us, timing.p10_us, timing.p90_us, timing.min_us, len(timing.samples_us),
                   timing.graph, calc_diff)

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if value is not None}


@dataclass
class LayerResult:
    layer: BlockLayer
    backend: str  # the path deepgemm's module took: "sm90", "reference" or "bf16" (routed / the router)
    times: dict[str, Timed]

    def to_json(self) -> dict[str, Any]:
        layer = self.layer
        return {"name": layer.name, "category": layer.category, "m": layer.m, "n": layer.n, "k": layer.k,
                "experts": layer.experts, "active_experts": layer.active_experts, "source": layer.source,
                "flops": layer.flops, "backend": self.backend,
                "times": {impl: timed.to_json() for impl, timed in self.times.items()}}


@dataclass
class TokenResult:
    tokens: int
    phase: Phase
    routing: RoutingPlan | None
    block: dict[str, Timed]
    layers: list[LayerResult]

    def speedup(self, peer: str) -> float | None:
        """deepgemm's speedup over `peer` on the whole block (peer time / deepgemm time)."""
        ours, theirs = self.block.get(DEEPGEMM), self.block.get(peer)
        if ours is None or theirs is None or not ours.ok or not theirs.ok:
            return None
        return theirs.median_us / ours.median_us  # type: ignore[operator]

    def tokens_per_s(self, impl: str) -> float | None:
        timed = self.block.get(impl)
        return self.tokens / (timed.median_us * 1e-6) if timed is not None and timed.ok else None  # type: ignore[operator]

    def layer_time_us(self) -> tuple[float, float] | None:
        """(deepgemm's layer time in its own kernels, its total layer time), each the sum of per-layer medians;
        None unless every layer was timed."""
        ours = total = 0.0
        for result in self.layers:
            timed = result.times.get(DEEPGEMM)
            if timed is None or not timed.ok:
                return None
            total += timed.median_us  # type: ignore[operator]
            if result.backend == "sm90":
                ours += timed.median_us  # type: ignore[operator]
        return ours, total

    def our_kernel_share(self) -> float | None:
        """The fraction of deepgemm's block GEMM time (sum over its layers) spent in layers that ran deepgemm's
        kernels; the rest ran in BF16 (the router, layers Fp8Linear routes to a BF16 matmul)."""
        times = self.layer_time_us()
        return times[0] / times[1] if times and times[1] > 0 else None

    def to_json(self) -> dict[str, Any]:
        routing = None
        if self.routing is not None:
            r = self.routing
            routing = {"experts": r.experts, "top_k": r.top_k, "rows": r.rows, "active_experts": r.active_experts,
                       "rows_per_expert": [min(r.counts), max(r.counts)], "form": r.form,
                       "kernel_rows": r.kernel_rows, "max_m": r.max_m if r.form == "masked" else None,
                       "expected_m": r.expected_m if r.form == "masked" else None,
                       "alignment": r.alignment}
        share = self.our_kernel_share()
        return {"tokens": self.tokens, "phase": self.phase, "moe": routing,
                "block": {impl: timed.to_json() for impl, timed in self.block.items()},
                "tokens_per_s": {impl: self.tokens_per_s(impl) for impl in self.block if self.tokens_per_s(impl)},
                "speedup": {peer: self.speedup(peer) for peer in self.block
                            if peer != DEEPGEMM and self.speedup(peer) is not None},
                "our_kernel_share": share, "layers": [layer.to_json() for layer in self.layers]}


@dataclass
class BlockResults:
    model: ModelSpec
    implementations: list[str]
    left_out: dict[str, str]
    settings: dict[str, Any]
    environment: dict[str, Any]
    results: list[TokenResult]

    @property
    def kind(self) -> str:
        return "MoE" if is_moe_block(self.model) else "dense"

    def problems(self) -> list[str]:
        """Lines naming every layer or block deepgemm failed or was inaccurate on."""
        lines = []
        for result in self.results:
            for layer in result.layers:
                timed = layer.times.get(DEEPGEMM)
                if timed is not None and timed.status == "error":
                    lines.append(f"{result.tokens} tokens, {layer.layer.name}: deepgemm failed: {timed.reason}")
                elif timed is not None and not timed.accurate:
                    lines.append(f"{result.tokens} tokens, {layer.layer.name}: deepgemm calc_diff {timed.calc_diff:.1e} "
                                 f"against {BF16} (limit {DIFF_LIMIT:.0e})")
            block = result.block.get(DEEPGEMM)
            if block is not None and block.status == "error":
                lines.append(f"{result.tokens} tokens: deepgemm's block failed: {block.reason}")
        return lines

    @property
    def exit_code(self) -> int:
        return 1 if self.problems() else 0

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION,
                "model": {"name": self.model.name, "description": self.model.describe(), "block": self.kind},
                "implementations": {name: IMPLEMENTATIONS[name] for name in self.implementations},
                "left_out": self.left_out, "settings": self.settings, "environment": self.environment,
                "results": [result.to_json() for result in self.results]}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class BlockSettings:
    iters: int = 30
    warmup: int = 5
    flush_l2: bool = True
    use_graph: bool = True
    seed: int = 0
    skip: tuple[str, ...] = ()  # peers left out on request (SKIPPABLE)

    def to_json(self) -> dict[str, Any]:
        return {"iters": self.iters, "warmup": self.warmup, "flush_l2_bytes": FLUSH_BYTES if self.flush_l2 else 0,
                "use_graph": self.use_graph, "seed": self.seed, "skip": list(self.skip),
                "decode_max_tokens": DECODE_MAX_TOKENS}


# -- running -------------------------------------------------------------------------------------------------------

def run_block_bench(model: ModelSpec, tokens: Sequence[int], settings: BlockSettings, *,
                    device: torch.device | str = "cuda", progress: Progress | None = None,
                    log: Callable[[str], None] | None = None) -> BlockResults:
    """Build the block's modules once per implementation, then at every token count check each layer once (eager,
    which also compiles), time every implementation's block interleaved, then each layer interleaved."""
    say = log or (lambda _: None)
    plans = {count: block_plan(model, count) for count in tokens}
    names = [name for name in IMPLEMENTATIONS if name not in settings.skip]
    left_out = {name: "left out on request (--skip)" for name in IMPLEMENTATIONS if name in settings.skip}
    say(f"building {model.name}'s {'MoE' if is_moe_block(model) else 'dense'} block weights "
        f"(seed {settings.seed}) and the modules of {', '.join(names)}...")
    weights = make_weights(model, plans.values(), device, settings.seed)
    implementations = build_implementations(weights, names)
    iterate = progress or (lambda items, _description, _label: iter(items))
    results = []
    for count in iterate(list(plans), "benchmarking", lambda t: f"{t} tokens"):
        results.append(_measure_tokens(plans[count], implementations, settings, device))
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    env = gpu_environment() if torch.device(device).type == "cuda" else {"device": str(device),
                                                                         "torch": torch.__version__}
    return BlockResults(model, names, left_out, settings.to_json(), env, results)


def _measure_tokens(plan: BlockPlan, implementations: Sequence[BlockImplementation], settings: BlockSettings,
                    device: torch.device | str) -> TokenResult:
    routing = Routing.build(plan.routing, device) if plan.routing is not None else None
    inputs = make_inputs(plan, device, settings.seed)
    prepared: dict[str, list[Step]] = {}
    checked: dict[str, dict[str, Any]] = {}  # impl -> layer -> output (or Timed for a failure)
    for impl in implementations:
        with torch.inference_mode():
            prepared[impl.name] = impl.steps(plan, routing, inputs)
        checked[impl.name] = _check(impl.name, prepared[impl.name], device)
    diffs = _diffs(prepared, checked)

    block_fns = {name: _block_fn(steps) for name, steps in prepared.items()
                 if not any(isinstance(out, Timed) for out in checked[name].values())}
    block_times = _time_group(block_fns, settings)
    block: dict[str, Timed] = {}
    for impl in implementations:
        outputs = checked[impl.name]
        failed = [(name, out) for name, out in outputs.items() if isinstance(out, Timed)]
        if failed:
            status = "error" if any(t.status == "error" for _, t in failed) else failed[0][1].status
            block[impl.name] = Timed(status, reason=f"{failed[0][0]}: {failed[0][1].reason}"
                                     + (f" (and {len(failed) - 1} more layers)" if len(failed) > 1 else ""))
        else:
            block[impl.name] = _timed(impl.name, block_times[impl.name])

    layers = []
    for index, layer in enumerate(plan.layers):
        fns, times = {}, {}
        for impl in implementations:
            out = checked[impl.name][layer.name]
            if isinstance(out, Timed):
                times[impl.name] = out
                continue
            step = prepared[impl.name][index]
            fixed = step.input if layer.source is None else checked[impl.name][f"{layer.source}#input"]
            fns[impl.name] = _layer_fn(step, fixed)
        for name, timing in _time_group(fns, settings).items():
            times[name] = _timed(name, timing, diffs.get((name, layer.name)))
        deepgemm = next((impl for impl in implementations if impl.name == DEEPGEMM), None)
        layers.append(LayerResult(layer, deepgemm.backend(layer) if deepgemm else "-",
                                  {impl.name: times[impl.name] for impl in implementations}))
    return TokenResult(plan.tokens, plan.phase, plan.routing, block, layers)


def _check(name: str, steps: list[Step], device: torch.device | str) -> dict[str, Any]:
    """Run each layer once in block order (eager; this also compiles): its output, or a Timed failure. The output
    of a layer another one reads is also kept, cloned, as that layer's fixed input for its own timing."""
    outputs: dict[str, Any] = {}
    sources = {step.layer.source for step in steps if step.layer.source is not None}
    with torch.inference_mode():
        for step in steps:
            layer = step.layer
            if layer.source is not None and isinstance(outputs.get(layer.source), Timed):
                failed: Timed = outputs[layer.source]
                outputs[layer.name] = Timed(failed.status, reason=f"its input layer {layer.source} did not run")
                continue
            x = step.input if layer.source is None else outputs[layer.source]
            try:
                out = step.fn(x)
                if torch.device(device).type == "cuda":
                    torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - reported per layer, the run goes on
                outputs[layer.name] = _failure(name, exc, layer)
                continue
            outputs[layer.name] = out
            if layer.name in sources:
                outputs[f"{layer.name}#input"] = _clone(out)
    return outputs


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    return [item.clone() for item in value]


def _diffs(prepared: dict[str, list[Step]], checked: dict[str, dict[str, Any]]) -> dict[tuple[str, str], float]:
    """calc_diff of each FP8 implementation's layer outputs (their rows in routing order) against the BF16 one's."""
    if BF16 not in prepared:
        return {}
    diffs: dict[tuple[str, str], float] = {}
    reference_steps = {step.layer.name: step for step in prepared[BF16]}
    with torch.inference_mode():
        for name, steps in prepared.items():
            if name == BF16:
                continue
            for step in steps:
                ours, theirs = checked[name][step.layer.name], checked[BF16][step.layer.name]
                if isinstance(ours, Timed) or isinstance(theirs, Timed):
                    continue
                diffs[(name, step.layer.name)] = calc_diff(step.rows(ours).float(),
                                                           reference_steps[step.layer.name].rows(theirs).float())
    return diffs


def _block_fn(steps: list[Step]) -> Callable[[], Any]:
    def block() -> Any:
        with torch.inference_mode():
            outputs: dict[str, Any] = {}
            for step in steps:
                x = step.input if step.layer.source is None else outputs[step.layer.source]
                outputs[step.layer.name] = step.fn(x)
        return outputs

    return block


def _layer_fn(step: Step, x: Any) -> Callable[[], Any]:
    def layer() -> Any:
        with torch.inference_mode():
            return step.fn(x)

    return layer


def _time_group(fns: dict[str, Callable[[], Any]], settings: BlockSettings) -> dict[str, Timing | BaseException]:
    """Time the callables interleaved (same clock for all); if that fails, each alone, to tell which one fails."""
    if not fns:
        return {}

    def time(group: list[Callable[[], Any]]) -> list[Timing]:
        return bench_gpu_interleaved(group, iters=settings.iters, warmup=settings.warmup, flush_l2=settings.flush_l2,
                                     use_graph=settings.use_graph)

    try:
        return dict(zip(fns, time(list(fns.values()))))
    except Exception:  # noqa: BLE001 - time them one by one
        results: dict[str, Timing | BaseException] = {}
        for name, fn in fns.items():
            try:
                results[name] = time([fn])[0]
            except Exception as exc:  # noqa: BLE001
                results[name] = exc
        return results


def _timed(name: str, timing: Timing | BaseException, diff: float | None = None) -> Timed:
    if isinstance(timing, BaseException):
        return _failure(name, timing)
    return Timed.from_timing(timing, diff)


def _failure(name: str, exc: BaseException, layer: BlockLayer | None = None) -> Timed:
    """deepgemm failing is an "error" (unless it says the shape is unsupported: "n/a"); cuBLAS block-wise raising
    is a refusal; anything else a peer cannot do is "n/a"."""
    text = str(exc).strip().splitlines()
    first = (text[0] if text else "").split(" when calling `")[0]  # cuBLAS: the status, not the call's arguments
    reason = f"{type(exc).__name__}: {first[:160]}"
    if layer is not None:
        reason += f" ({'x'.join(map(str, layer.shape))})"
    status: Status
    if isinstance(exc, (Unavailable, UnsupportedError)):
        status = "n/a"
    elif name == DEEPGEMM:
        status = "error"
    else:
        status = "refused" if name == BLOCKWISE else "n/a"
    return Timed(status, reason=reason)
