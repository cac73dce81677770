"""The hyper-parameters of a decoder-only transformer that decide its GEMM shapes."""

from __future__ import annotations

from dataclasses import dataclass, field


class ModelConfigError(ValueError):
    """A model description is missing fields or holds values that cannot describe a model."""


# Activation names of a SiLU (swish) gate, as model configs spell them.
SILU_ACTIVATIONS = ("silu", "swish")


@dataclass(frozen=True)
class MlaSpec:
    """DeepSeek multi-head latent attention (MLA) dimensions."""

    q_lora_rank: int | None  # None: queries are projected straight from the hidden state
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoeSpec:
    """Mixture-of-experts feed-forward layers."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_intermediate_size: int = 0  # total width of the shared expert(s); 0 when there are none
    first_dense_layers: int = 0  # DeepSeek's first_k_dense_replace
    layer_frequency: int = 1  # every n-th layer (after the dense ones) is a MoE layer
    # Which n-th: layer i (from 0) is MoE when (i + layer_offset) % layer_frequency == 0; Qwen's decoder_sparse_step
    # counts from 1 (offset 1), DeepSeek's moe_layer_freq from 0 (offset 0).
    layer_offset: int = 1

    def num_moe_layers(self, num_layers: int) -> int:
        candidates = range(self.first_dense_layers, num_layers)
        return sum(1 for layer in candidates if (layer + self.layer_offset) % self.layer_frequency == 0)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    intermediate_size: int  # dense MLP width (the gate and up projections each have this many outputs)
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    gated_mlp: bool = True  # SwiGLU/GeGLU (gate, up, down) versus a plain up/down MLP
    activation: str = "silu"
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for attr in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
            _require_positive(self.name, attr, getattr(self, attr))
        if self.intermediate_size < 0:
            raise ModelConfigError(f"{self.name}: intermediate_size must be >= 0, got {self.intermediate_size}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"{self.name}: num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})")
        if self.moe is not None:
            _validate_moe(self.name, self.moe, self.num_layers)
        if self.mla is not None:
            for attr in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                _require_positive(self.name, attr, getattr(self.mla, attr))
        if self.num_dense_mlp_layers and self.intermediate_size == 0:
            raise ModelConfigError(f"{self.name}: dense MLP layers need intermediate_size > 0")

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.moe.num_moe_layers(self.num_layers)

    @property
    def num_dense_mlp_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def attention_kind(self) -> str:
        if self.mla is not None:
            return "MLA"
        if self.num_kv_heads == 1:
            return "MQA"
        return "MHA" if self.num_kv_heads == self.num_heads else "GQA"

    @property
    def silu_gated(self) -> bool:
        """A SiLU-gated MLP (SwiGLU): what silu_mul_quantize_per_token_group fuses."""
        return self.gated_mlp and self.activation.lower() in SILU_ACTIVATIONS

    def describe(self) -> str:
        parts = [f"hidden {self.hidden_size}", f"{self.num_layers} layers",
                 f"{self.num_heads} heads ({self.attention_kind}, {self.num_kv_heads} KV)",
                 f"vocab {self.vocab_size}"]
        mlp = "SwiGLU" if self.silu_gated else (
            f"gated {self.activation}" if self.gated_mlp else self.activation)
        if self.num_dense_mlp_layers:
            parts.append(f"{mlp} MLP {self.intermediate_size} x{self.num_dense_mlp_layers}")
        if self.moe is not None:
            shared = f" + {self.moe.num_shared_experts} shared" if self.moe.num_shared_experts else ""
            parts.append(f"MoE {self.moe.num_experts} experts top-{self.moe.experts_per_token}{shared}, "
                         f"width {self.moe.expert_intermediate_size} x{self.num_moe_layers}")
        if self.mla is not None:
            parts.append(f"MLA q_lora {self.mla.q_lora_rank} kv_lora {self.mla.kv_lora_rank}")
        return ", ".join(parts)


def _require_positive(model: str, attr: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelConfigError(f"{model}: {attr} must be a positive integer, got {value!r}")


def _validate_moe(model: str, moe: MoeSpec, num_layers: int) -> None:
    for attr in ("num_experts", "experts_per_token", "expert_intermediate_size", "layer_frequency"):
        _require_positive(model, attr, getattr(moe, attr))
    if moe.experts_per_token > moe.num_experts:
        raise ModelConfigError(
            f"{model}: num_experts_per_tok ({moe.experts_per_token}) exceeds the number of experts ({moe.num_experts})")
    if not 0 <= moe.first_dense_layers <= num_layers:
        raise ModelConfigError(f"{model}: first_k_dense_replace ({moe.first_dense_layers}) is outside 0..{num_layers}")
    if moe.num_shared_experts and moe.shared_intermediate_size <= 0:
        raise ModelConfigError(f"{model}: shared experts need a positive intermediate size")
