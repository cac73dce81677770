"""Read a Hugging Face ``config.json`` (local file only) into a :class:`ModelSpec`.

Understood key families: Llama/Mistral/Qwen (``hidden_size``,
``num_key_value_heads``…), GPT-2 style (``n_embd``, ``n_layer``…), Mixtral and
Qwen MoE (``num_local_experts``/``num_experts``, ``shared_expert_intermediate_size``),
DeepSeek V2/V3 (MLA ranks, ``n_routed_experts``, ``first_k_dense_replace``).
Multimodal configs are read through their ``text_config``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deepgemm.analysis.models import MlaSpec, ModelConfigError, ModelSpec, MoeSpec

# Architectures whose MLP has a gate projection (SwiGLU / GeGLU); another model_type is assumed gated, with a note.
_GATED_MODEL_TYPES = frozenset({"llama", "llama4", "llama4_text", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3",
                                "qwen3_moe", "deepseek_v2", "deepseek_v3", "gemma", "gemma2", "gemma3", "gemma3_text",
                                "phi3", "glm", "glm4", "glm4_moe", "olmo", "olmo2", "granite", "granitemoe",
                                "internlm2", "yi", "baichuan", "exaone", "cohere", "cohere2", "minicpm", "dbrx"})
# Architectures whose MLP is a plain up -> activation -> down (no gate projection).
_UNGATED_MODEL_TYPES = frozenset({"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "falcon", "phi", "opt", "bloom",
                                  "starcoder2", "mpt", "bert", "roberta", "gpt_neo", "codegen"})


def load_hf_config(path: str | Path) -> ModelSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    default_name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return parse_hf_config(raw, default_name=default_name, source=str(path))


def parse_hf_config(raw: Mapping[str, Any], *, default_name: str = "model", source: str = "config") -> ModelSpec:
    fields = _Fields(_text_config(raw), source)
    model_type = str(fields.raw.get("model_type", "")).lower()
    hidden = fields.integer("hidden_size", "n_embd", "d_model")
    heads = fields.integer("num_attention_heads", "n_head", "num_heads")
    kv_heads = _kv_heads(fields, heads)
    gated = model_type not in _UNGATED_MODEL_TYPES
    default_width = None if gated else 4 * hidden
    return ModelSpec(
        name=str(fields.raw.get("_name_or_path") or default_name),
        hidden_size=hidden,
        # (Llama 4: intermediate_size_mlp is the dense layers' width, intermediate_size the experts')
        intermediate_size=fields.integer("intermediate_size_mlp", "intermediate_size", "n_inner", "ffn_dim",
                                         default=default_width),
        num_layers=fields.integer("num_hidden_layers", "n_layer", "num_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_head_dim(fields, hidden, heads, source),
        vocab_size=fields.integer("vocab_size"),
        gated_mlp=gated,
        activation=str(fields.raw.get("hidden_activation") or fields.raw.get("hidden_act") or
                       fields.raw.get("activation_function") or ("silu" if gated else "gelu")),
        mla=_mla(fields),
        moe=_moe(fields, model_type),
        notes=_notes(fields.raw, model_type),
    )


def _notes(raw: Mapping[str, Any], model_type: str) -> tuple[str, ...]:
    """What the analysis assumes about this config and does not read from it."""
    notes = []
    if model_type not in _GATED_MODEL_TYPES | _UNGATED_MODEL_TYPES:
        notes.append(f"model_type {model_type or '(none)'!r} is not a family deepgemm knows: its MLP is assumed "
                     "gated (gate, up, down)")
    if raw.get("sliding_window") and raw.get("use_sliding_window", True):
        notes.append(f"sliding_window {raw['sliding_window']} is not modelled: attention spans the whole context")
    quant = raw.get("quantization_config")
    if isinstance(quant, Mapping) and quant.get("quant_method", "fp8") != "fp8":
        notes.append(f"quantization_config ({quant.get('quant_method')}) is not modelled: the GEMMs are analysed in "
                     "the --dtype precision")
    return tuple(notes)


def _head_dim(fields: _Fields, hidden: int, heads: int, source: str) -> int:
    """head_dim as given (it need not divide hidden_size, e.g. GLM-4.5-Air), else hidden_size / heads."""
    given = fields.optional_integer("head_dim")
    return given if given is not None else _divide(hidden, heads, "hidden_size", "num_attention_heads", source)


class _Fields:
    """Typed access to config keys, with errors that name the file and the key."""

    def __init__(self, raw: Mapping[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source

    def integer(self, *keys: str, default: int | None = None, allow_zero: bool = False) -> int:
        for key in keys:
            value = self.raw.get(key)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (value == 0 and not allow_zero):
                raise ModelConfigError(f"{self.source}: {key!r} must be a positive integer, got {value!r}")
            return value
        if default is None:
            raise ModelConfigError(f"{self.source}: missing required key {' / '.join(repr(k) for k in keys)}")
        return default

    def optional_integer(self, *keys: str) -> int | None:
        if all(self.raw.get(key) is None for key in keys):
            return None
        return self.integer(*keys)


def _text_config(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    text = raw.get("text_config")
    if isinstance(text, Mapping):
        return {**{k: v for k, v in raw.items() if k != "text_config"}, **text}
    return raw


def _divide(numerator: int, denominator: int, num_key: str, den_key: str, source: str) -> int:
    if numerator % denominator:
        raise ModelConfigError(f"{source}: {num_key} ({numerator}) is not a multiple of {den_key} ({denominator}); "
                               "give 'head_dim' explicitly")
    return numerator // denominator


def _kv_heads(fields: _Fields, heads: int) -> int:
    if fields.raw.get("multi_query") is True:
        return 1
    return fields.integer("num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads)


def _mla(fields: _Fields) -> MlaSpec | None:
    kv_lora_rank = fields.optional_integer("kv_lora_rank")
    if kv_lora_rank is None:
        return None
    return MlaSpec(
        q_lora_rank=fields.optional_integer("q_lora_rank"),
        kv_lora_rank=kv_lora_rank,
        qk_nope_head_dim=fields.integer("qk_nope_head_dim"),
        qk_rope_head_dim=fields.integer("qk_rope_head_dim"),
        v_head_dim=fields.integer("v_head_dim"),
    )


def _moe(fields: _Fields, model_type: str) -> MoeSpec | None:
    num_experts = fields.integer("n_routed_experts", "num_local_experts", "num_experts", default=0, allow_zero=True)
    if num_experts == 0:  # absent, or 0: a dense model that spells the field out
        return None
    # Llama 4's MoE layers always add one shared expert of the experts' width (no config key says so).
    num_shared = fields.integer("n_shared_experts", default=1 if model_type.startswith("llama4") else 0,
                                allow_zero=True)
    expert_width = fields.integer("moe_intermediate_size", "intermediate_size")
    shared_width = fields.integer("shared_expert_intermediate_size", default=num_shared * expert_width,
                                  allow_zero=True)
    if shared_width and not num_shared:
        num_shared = 1  # Qwen MoE: one shared expert of shared_expert_intermediate_size
    return MoeSpec(
        num_experts=num_experts,
        experts_per_token=fields.integer("num_experts_per_tok", "moe_top_k", "top_k"),
        expert_intermediate_size=expert_width,
        num_shared_experts=num_shared,
        shared_intermediate_size=shared_width,
        first_dense_layers=fields.integer("first_k_dense_replace", default=0, allow_zero=True),
        # (Llama 4's interleave_moe_layer_step counts like Qwen's decoder_sparse_step: layer i when (i + 1) % step == 0)
        layer_frequency=fields.integer("moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", default=1),
        layer_offset=0 if fields.raw.get("moe_layer_freq") is not None else 1,
    )
