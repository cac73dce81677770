"""``deepgemm bench --model``: the block's linear layers and its routing plan, from the model spec (no GPU needed).

A block is the model's layer kind that matters: for a mixture-of-experts model a MoE layer (attention projections,
the router, the routed experts and any shared experts), else a dense layer (attention projections, gate/up, down).
Its GEMMs come from ``deepgemm.analysis`` (``enumerate_gemms``: fused QKV and gate/up, MLA for DeepSeek); the
attention core, norms, embeddings and the LM head are not part of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from deepgemm.analysis.gemms import (
    ATTENTION_PROJ, DENSE_MLP, MOE_EXPERTS, ROUTER, SHARED_EXPERTS, Workload, enumerate_gemms,
)
from deepgemm.analysis.models import ModelSpec
from deepgemm.api.grouped import MASKED_M_ALIGNMENT, get_m_alignment_for_contiguous_layout
from deepgemm.utils import align_up

DEFAULT_TOKENS = (1, 64, 4096)
# Token counts up to this are a decode step (that many sequences, one new token each: masked experts, absorbed MLA);
# above it, a prefill of one sequence (contiguous experts, MLA expands its latent with kv_b_proj). 128 is the largest
# batch engines commonly dispatch per rank in DeepEP's low-latency (masked, CUDA-graph) mode.
DECODE_MAX_TOKENS = 128

Phase = Literal["prefill", "decode"]
MoeForm = Literal["masked", "contiguous"]


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
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"{self.model.name}'s block has no layer {name!r}")


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
    moe = model.moe if is_moe_block(model) else None
    wanted = {ATTENTION_PROJ, ROUTER, MOE_EXPERTS, SHARED_EXPERTS} if moe is not None else {ATTENTION_PROJ, DENSE_MLP}
    layers: list[BlockLayer] = []
    for op in enumerate_gemms(model, workload):
        if op.category not in wanted or op.pass_ != "forward" or op.kind == "batched":
            continue
        source = None
        if op.name.endswith(".down_proj"):  # it reads the activation of the last layer of its MLP
            prefix = op.name.removesuffix("down_proj")
            source = next((layer.name for layer in reversed(layers) if layer.name.startswith(prefix)), None)
        experts = moe.num_experts if moe is not None and op.category == MOE_EXPERTS else 0
        layers.append(BlockLayer(op.name, op.category, op.m, op.n, op.k, experts, op.groups if experts else 0, source))
    routing = None
    if moe is not None:
        routing = RoutingPlan(tokens, moe.num_experts, moe.experts_per_token,
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
