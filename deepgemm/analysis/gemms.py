"""Enumerate every GEMM of a transformer step (prefill, decode or training) on one tensor-parallel rank."""

from __future__ import annotations

from dataclasses import dataclass

from deepgemm.analysis.gpus import Precision
from deepgemm.analysis.models import ModelSpec
from deepgemm.analysis.ops import ATTENTION_CORE, GemmOp, Operand, Phase, backward_ops

ATTENTION_PROJ = "attention projections"
DENSE_MLP = "dense MLP"
MOE_EXPERTS = "MoE experts"
SHARED_EXPERTS = "shared experts"
ROUTER = "router"
LM_HEAD = "LM head"
CATEGORIES = (ATTENTION_PROJ, ATTENTION_CORE, DENSE_MLP, MOE_EXPERTS, SHARED_EXPERTS, ROUTER, LM_HEAD)
BF16_CATEGORIES = frozenset({ROUTER, LM_HEAD})


@dataclass(frozen=True)
class Workload:
    """What is run: ``batch`` sequences of ``seq`` prompt tokens, then a decode step of ``decode_tokens``
    new tokens per sequence against a KV cache of ``seq`` tokens; or, with ``train``, a training step."""

    batch: int = 1
    seq: int = 4096
    decode_tokens: int = 0
    include_prefill: bool = True
    tp: int = 1
    train: bool = False
    precision: Precision = "fp8"
    fused: bool = True  # fused QKV and gate/up projections, as inference engines run them

    def __post_init__(self) -> None:
        for name, value, minimum in (("--batch", self.batch, 1), ("--seq", self.seq, 1), ("--tp", self.tp, 1),
                                     ("--decode-tokens", self.decode_tokens, 0)):
            if value < minimum:
                raise ValueError(f"argument {name}: must be >= {minimum}, got {value}")
        if self.train and self.decode_tokens:
            raise ValueError("argument --train: a training step has no decode phase; drop --decode-tokens")
        if not self.phases:
            raise ValueError("argument --decode-tokens: nothing to analyse (no prefill and no decode tokens)")

    @property
    def phases(self) -> tuple[Phase, ...]:
        if self.train:
            return ("train",)
        prefill: tuple[Phase, ...] = ("prefill",) if self.include_prefill else ()
        return prefill + (("decode",) if self.decode_tokens else ())


@dataclass(frozen=True)
class StepShape:
    """Row counts of one phase: ``tokens`` rows through every linear layer."""

    phase: Phase
    sequences: int
    q_len: int  # new tokens per sequence
    kv_len: int  # keys/values each new token attends to
    lm_head_rows: int
    absorbed_mla: bool  # DeepSeek's decode path: W_UK/W_UV absorbed, attention in the latent space

    @property
    def tokens(self) -> int:
        return self.sequences * self.q_len


def step_shape(phase: Phase, workload: Workload) -> StepShape:
    b, s = workload.batch, workload.seq
    if phase == "decode":
        t = workload.decode_tokens
        return StepShape(phase, b, t, s + t, b * t, absorbed_mla=True)
    lm_rows = b * s if phase == "train" else b  # inference prefill needs the last position's logits only
    return StepShape(phase, b, s, s, lm_rows, absorbed_mla=False)


def enumerate_gemms(model: ModelSpec, workload: Workload) -> list[GemmOp]:
    """Every GEMM of every phase of ``workload``, forward first; training adds dgrad and wgrad."""
    ops: list[GemmOp] = []
    for phase in workload.phases:
        forward = _StepBuilder(model, workload, step_shape(phase, workload)).build()
        ops.extend(forward)
        if phase == "train":
            ops.extend(grad for op in forward for grad in backward_ops(op))
    return ops


class _StepBuilder:
    def __init__(self, model: ModelSpec, workload: Workload, step: StepShape) -> None:
        self.model = model
        self.workload = workload
        self.step = step
        self.tp = workload.tp
        self.heads = _split(model.num_heads, self.tp, "num_attention_heads")
        self.kv_heads = _split_kv_heads(model.num_kv_heads, self.tp)

    def build(self) -> list[GemmOp]:
        attention = self._mla() if self.model.mla is not None else self._attention()
        return attention + self._dense_mlp() + self._moe() + [self._lm_head()]

    # -- building blocks -------------------------------------------------------------------------------------

    def _linear(self, name: str, category: str, n: int, k: int, count: int, *, m: int | None = None,
                groups: int = 1) -> GemmOp:
        """A weight GEMM: ``m`` token rows (all experts' rows for a grouped one) by [n, k] weights.

        The router and the LM head stay in bf16 (as in DeepSeek-V3's FP8 recipe)."""
        rows = self.step.tokens if m is None else m
        precision: Precision = "bf16" if category in BF16_CATEGORIES else self.workload.precision
        return GemmOp(name=name, category=category, phase=self.step.phase, kind="grouped" if groups > 1 else "dense",
                      m=rows, n=n, k=k, batch=1, count=count, precision=precision,
                      a=Operand(1, rows, k), b=Operand(groups, n, k), d=Operand(1, rows, n), groups=groups)

    def _batched(self, name: str, m: int, n: int, k: int, batch: int, *, b_matrices: int,
                 a_on_chip: bool = False, d_on_chip: bool = False, b_on_chip: bool = False,
                 category: str = ATTENTION_CORE) -> GemmOp:
        """A batched product in bf16 (attention's own, or MLA's per-head weights), ``batch`` instances;
        ``b_matrices`` distinct B operands."""
        return GemmOp(name=name, category=category, phase=self.step.phase, kind="batched", m=m, n=n, k=k,
                      batch=batch, count=self.model.num_layers, precision="bf16",
                      a=Operand(batch, m, k, on_chip=a_on_chip), b=Operand(b_matrices, n, k, on_chip=b_on_chip),
                      d=Operand(batch, m, n, on_chip=d_on_chip))

    def _scores_and_values(self, qk_dim: int, v_dim: int, kv_matrices: int, *,
                           v_in_k: bool = False) -> list[GemmOp]:
        """Fused attention: scores S = Q K^T and O = P V; S and P stay on chip. v_in_k: V is part of the K rows
        already read (MLA's latent cache), so O = P V reads no further bytes."""
        step, instances = self.step, self.step.sequences * self.heads
        return [
            self._batched("attn.qk", step.q_len, step.kv_len, qk_dim, instances, b_matrices=kv_matrices,
                          d_on_chip=True),
            self._batched("attn.pv", step.q_len, v_dim, step.kv_len, instances, b_matrices=kv_matrices,
                          a_on_chip=True, b_on_chip=v_in_k),
        ]

    # -- attention -------------------------------------------------------------------------------------------

    def _attention(self) -> list[GemmOp]:
        model, layers, hd = self.model, self.model.num_layers, self.model.head_dim
        q_out, kv_out = self.heads * hd, self.kv_heads * hd
        if self.workload.fused:
            projections = [self._linear("attn.qkv_proj", ATTENTION_PROJ, q_out + 2 * kv_out, model.hidden_size, layers)]
        else:
            projections = [self._linear(f"attn.{p}_proj", ATTENTION_PROJ, width, model.hidden_size, layers)
                           for p, width in (("q", q_out), ("k", kv_out), ("v", kv_out))]
        core = self._scores_and_values(hd, hd, self.step.sequences * self.kv_heads)
        return projections + core + [self._linear("attn.o_proj", ATTENTION_PROJ, model.hidden_size, q_out, layers)]

    def _mla(self) -> list[GemmOp]:
        model, mla, layers = self.model, self.model.mla, self.model.num_layers
        assert mla is not None
        hidden, heads = model.hidden_size, self.heads
        kv_a_out = mla.kv_lora_rank + mla.qk_rope_head_dim
        ops: list[GemmOp] = []
        if mla.q_lora_rank is None:
            ops.append(self._linear("attn.q_proj", ATTENTION_PROJ, heads * mla.qk_head_dim, hidden, layers))
            ops.append(self._linear("attn.kv_a_proj_with_mqa", ATTENTION_PROJ, kv_a_out, hidden, layers))
        elif self.workload.fused:
            ops.append(self._linear("attn.q_a_proj+kv_a_proj", ATTENTION_PROJ, mla.q_lora_rank + kv_a_out, hidden,
                                    layers))
        else:
            ops.append(self._linear("attn.q_a_proj", ATTENTION_PROJ, mla.q_lora_rank, hidden, layers))
            ops.append(self._linear("attn.kv_a_proj_with_mqa", ATTENTION_PROJ, kv_a_out, hidden, layers))
        if mla.q_lora_rank is not None:
            ops.append(self._linear("attn.q_b_proj", ATTENTION_PROJ, heads * mla.qk_head_dim, mla.q_lora_rank, layers))
        ops.extend(self._mla_absorbed_core() if self.step.absorbed_mla else self._mla_expanded_core())
        ops.append(self._linear("attn.o_proj", ATTENTION_PROJ, hidden, heads * mla.v_head_dim, layers))
        return ops

    def _mla_expanded_core(self) -> list[GemmOp]:
        """Prefill/training: kv_b_proj expands the latent of every cached token into per-head K and V."""
        mla, step = self.model.mla, self.step
        assert mla is not None
        expand = self._linear("attn.kv_b_proj", ATTENTION_PROJ, self.heads * (mla.qk_nope_head_dim + mla.v_head_dim),
                              mla.kv_lora_rank, self.model.num_layers, m=step.sequences * step.kv_len)
        return [expand, *self._scores_and_values(mla.qk_head_dim, mla.v_head_dim, step.sequences * self.heads)]

    def _mla_absorbed_core(self) -> list[GemmOp]:
        """Decode: queries move into the latent space (W_UK), attention runs there, W_UV maps back per head."""
        mla, step, heads = self.model.mla, self.step, self.heads
        assert mla is not None
        latent = mla.kv_lora_rank
        # W_UK and W_UV are weights (kv_b_proj's halves) applied per head: projections, not attention products.
        absorb_q = self._batched("attn.q_absorb(W_UK)", step.tokens, latent, mla.qk_nope_head_dim, heads,
                                 b_matrices=heads, category=ATTENTION_PROJ)
        core = self._scores_and_values(latent + mla.qk_rope_head_dim, latent, step.sequences, v_in_k=True)
        absorb_v = self._batched("attn.v_absorb(W_UV)", step.tokens, mla.v_head_dim, latent, heads, b_matrices=heads,
                                 category=ATTENTION_PROJ)
        return [absorb_q, *core, absorb_v]

    # -- feed-forward ----------------------------------------------------------------------------------------

    def _mlp(self, prefix: str, category: str, width: int, count: int, *, m: int | None = None,
             groups: int = 1) -> list[GemmOp]:
        hidden = self.model.hidden_size
        if not self.model.gated_mlp:
            ups = [(f"{prefix}.up_proj", width)]
        elif self.workload.fused:
            ups = [(f"{prefix}.gate_up_proj", 2 * width)]
        else:
            ups = [(f"{prefix}.gate_proj", width), (f"{prefix}.up_proj", width)]
        ops = [self._linear(name, category, n, hidden, count, m=m, groups=groups) for name, n in ups]
        return ops + [self._linear(f"{prefix}.down_proj", category, hidden, width, count, m=m, groups=groups)]

    def _dense_mlp(self) -> list[GemmOp]:
        layers = self.model.num_dense_mlp_layers
        if not layers:
            return []
        width = _split(self.model.intermediate_size, self.tp, "intermediate_size")
        return self._mlp("mlp", DENSE_MLP, width, layers)

    def _moe(self) -> list[GemmOp]:
        moe, layers = self.model.moe, self.model.num_moe_layers
        if moe is None or not layers:
            return []
        routed_rows = self.step.tokens * moe.experts_per_token
        active_experts = min(moe.num_experts, routed_rows)  # balanced routing
        ops = [self._linear("moe.router", ROUTER, moe.num_experts, self.model.hidden_size, layers)]
        width = _split(moe.expert_intermediate_size, self.tp, "moe_intermediate_size")
        ops += self._mlp("moe.experts", MOE_EXPERTS, width, layers, m=routed_rows, groups=active_experts)
        if moe.num_shared_experts:
            shared_width = _split(moe.shared_intermediate_size, self.tp, "shared expert width")
            ops += self._mlp("moe.shared_experts", SHARED_EXPERTS, shared_width, layers)
        return ops

    def _lm_head(self) -> GemmOp:
        vocab = -(-self.model.vocab_size // self.tp)  # vocabulary split across ranks, padded
        return self._linear("lm_head", LM_HEAD, vocab, self.model.hidden_size, 1, m=self.step.lm_head_rows)


def _split(size: int, tp: int, what: str) -> int:
    if size % tp:
        raise ValueError(f"argument --tp: {what} ({size}) is not divisible by {tp}")
    return size // tp


def _split_kv_heads(kv_heads: int, tp: int) -> int:
    """KV heads per rank; fewer KV heads than ranks are replicated."""
    if kv_heads >= tp:
        return _split(kv_heads, tp, "num_key_value_heads")
    if tp % kv_heads:
        raise ValueError(f"argument --tp: {tp} ranks cannot share {kv_heads} KV heads evenly")
    return 1


def assumptions(model: ModelSpec, workload: Workload) -> list[str]:
    """The modelling choices behind the numbers, printed with them."""
    notes = [
        f"one tensor-parallel rank of {workload.tp}" if workload.tp > 1 else "a single GPU (no tensor parallelism)",
        "FLOPs are 2*M*N*K per GEMM; attention scores are counted as full rectangles (a causal kernel skips about "
        "half in prefill)",
        "attention is fused (FlashAttention-style): the score and probability matrices stay on chip",
        f"linear layers in {workload.precision}" + (" with fp32 scales (1x128 activations, 128x128 weights)"
                                                    if workload.precision == "fp8" else "")
        + ", bf16 outputs; attention products, router and LM head in bf16",
    ]
    if workload.fused:
        notes.append("QKV and gate/up projections fused into one GEMM each (--no-fuse splits them)")
    if model.moe is not None:
        notes.append("MoE routing balanced: each expert gets tokens*top_k/experts rows; "
                     "min(experts, tokens*top_k) experts' weights are read")
    if model.mla is not None:
        notes.append("MLA: prefill/training expand the latent with kv_b_proj; decode absorbs W_UK/W_UV "
                     "and attends in the 512+64 latent space")
    if not workload.train and workload.include_prefill:
        notes.append("prefill computes logits for the last position of each sequence only")
    if workload.train:
        notes.append("training: dgrad and wgrad of every GEMM, weight gradients in fp32; "
                     "no activation recomputation")
    if "decode" in workload.phases:
        tokens = "1 new token" if workload.decode_tokens == 1 else f"{workload.decode_tokens} new tokens"
        notes.append(f"decode: {tokens} per sequence against a KV cache of {workload.seq} tokens")
    cut = _fp8_block_cuts(model, workload)
    if cut:
        notes.append(f"at tp {workload.tp} these weight shards are not whole 128x128 FP8 blocks: {', '.join(cut)}; "
                     "serving engines pad or refuse such a split")
    notes.extend(model.notes)
    return notes


def _fp8_block_cuts(model: ModelSpec, workload: Workload) -> list[str]:
    """The split widths (name = width / tp) of an FP8 tensor-parallel run that cut a 128-wide scale block."""
    if workload.precision != "fp8" or workload.tp == 1:
        return []
    widths = {}
    if model.moe is None or model.moe.num_moe_layers(model.num_layers) < model.num_layers:  # dense MLP layers
        widths["MLP width"] = model.intermediate_size
    if model.mla is not None:
        widths["attention heads x qk dim"] = model.num_heads * model.mla.qk_head_dim
        widths["attention heads x v dim"] = model.num_heads * model.mla.v_head_dim
    else:
        widths["attention heads x head_dim"] = model.num_heads * model.head_dim
    if model.moe is not None:
        widths["expert width"] = model.moe.expert_intermediate_size
        if model.moe.num_shared_experts:
            widths["shared expert width"] = model.moe.shared_intermediate_size
    return [f"{name} {width} / {workload.tp} = {width // workload.tp}" for name, width in widths.items()
            if width % workload.tp == 0 and (width // workload.tp) % 128]
