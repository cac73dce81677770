"""Hugging Face config.json parsing and model lookup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepgemm.analysis.hf_config import load_hf_config
from deepgemm.analysis.models import ModelConfigError
from deepgemm.analysis.presets import PRESETS, resolve_model

LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "hidden_act": "silu", "rope_theta": 500000.0, "tie_word_embeddings": False,
}

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 129280, "hidden_act": "silu", "num_nextn_predict_layers": 1,
}


def write(tmp_path: Path, content: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_llama_config_matches_preset(tmp_path: Path) -> None:
    spec = load_hf_config(write(tmp_path, LLAMA_3_8B))
    preset = PRESETS["llama-3-8b"]
    for attr in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "vocab_size", "gated_mlp", "mla", "moe"):
        assert getattr(spec, attr) == getattr(preset, attr), attr
    assert spec.attention_kind == "GQA"


def test_deepseek_v3_config_reads_mla_and_moe_fields(tmp_path: Path) -> None:
    spec = load_hf_config(write(tmp_path, DEEPSEEK_V3))
    assert spec.mla == PRESETS["deepseek-v3"].mla
    assert spec.moe == PRESETS["deepseek-v3"].moe
    assert (spec.num_moe_layers, spec.num_dense_mlp_layers) == (58, 3)


def test_mixtral_and_qwen_moe_fields(tmp_path: Path) -> None:
    mixtral = load_hf_config(write(tmp_path, {**LLAMA_3_8B, "model_type": "mixtral", "vocab_size": 32000,
                                              "num_local_experts": 8, "num_experts_per_tok": 2}))
    assert mixtral.moe is not None
    assert (mixtral.moe.num_experts, mixtral.moe.experts_per_token, mixtral.moe.expert_intermediate_size) == (
        8, 2, 14336)
    assert mixtral.num_dense_mlp_layers == 0
    qwen_moe = load_hf_config(write(tmp_path, {
        "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
        "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936, "num_experts": 60,
        "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "decoder_sparse_step": 1}, "qwen.json"))
    assert qwen_moe.moe is not None
    assert (qwen_moe.moe.num_shared_experts, qwen_moe.moe.shared_intermediate_size) == (1, 5632)
    assert qwen_moe.moe.expert_intermediate_size == 1408


def test_mla_without_q_lora_gpt2_keys_and_text_config(tmp_path: Path) -> None:
    lite = load_hf_config(write(tmp_path, {**DEEPSEEK_V3, "q_lora_rank": None}))
    assert lite.mla is not None and lite.mla.q_lora_rank is None
    gpt2 = load_hf_config(write(tmp_path, {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                                           "vocab_size": 50257, "activation_function": "gelu_new"}, "g.json"))
    assert (gpt2.gated_mlp, gpt2.intermediate_size, gpt2.head_dim, gpt2.activation) == (
        False, 3072, 64, "gelu_new")
    wrapped = load_hf_config(write(tmp_path, {"model_type": "llava", "text_config": LLAMA_3_8B}, "mm.json"))
    assert wrapped.hidden_size == 4096


def test_resolve_model_takes_presets_files_and_folders(tmp_path: Path) -> None:
    assert resolve_model("Llama-3-8B") is PRESETS["llama-3-8b"]
    folder = tmp_path / "my-model"
    folder.mkdir()
    write(folder, LLAMA_3_8B)
    assert resolve_model(str(folder)).name == "my-model"
    with pytest.raises(ModelConfigError, match="unknown model 'nope'"):
        resolve_model("nope")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({k: v for k, v in LLAMA_3_8B.items() if k != "hidden_size"}, "missing required key 'hidden_size'"),
        ({**LLAMA_3_8B, "num_hidden_layers": -4}, "'num_hidden_layers' must be a positive integer"),
        ({**LLAMA_3_8B, "num_attention_heads": "32"}, "'num_attention_heads' must be a positive integer"),
        ({**LLAMA_3_8B, "num_key_value_heads": 5}, "not a multiple"),
        ({**DEEPSEEK_V3, "num_experts_per_tok": 300}, "exceeds the number of experts"),
        ({**DEEPSEEK_V3, "v_head_dim": None}, "missing required key 'v_head_dim'"),
    ],
)
def test_malformed_configs_raise_clear_errors(tmp_path: Path, content: object, message: str) -> None:
    path = write(tmp_path, content)
    with pytest.raises(ModelConfigError, match=message):
        load_hf_config(path)


def test_review_findings_2026_12_05(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """head_dim given need not divide hidden_size (it was asked for anyway); num_experts 0 is a dense model (it was
    refused); Gemma's hidden_activation is read; --seq 0 is refused (it ran as 4096); exa-scale numbers get E."""
    from deepgemm.analysis.hf_config import parse_hf_config
    from deepgemm.analysis.units import si
    from deepgemm.cli import main

    glm = parse_hf_config({"model_type": "glm4_moe", "hidden_size": 4096, "num_attention_heads": 96,
                           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 10944,
                           "num_hidden_layers": 4, "vocab_size": 151552})
    assert glm.head_dim == 128
    dense = parse_hf_config({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                             "intermediate_size": 14336, "num_hidden_layers": 2, "vocab_size": 1000, "num_experts": 0})
    assert dense.moe is None
    gemma = parse_hf_config({"model_type": "gemma3_text", "hidden_size": 1152, "num_attention_heads": 4,
                             "head_dim": 256, "intermediate_size": 6912, "num_hidden_layers": 2, "vocab_size": 1000,
                             "hidden_activation": "gelu_pytorch_tanh"})
    assert gemma.activation == "gelu_pytorch_tanh"
    assert main(["shapes", "--model", "llama-3-8b", "--seq", "0"]) == 2
    assert "--seq: must be >= 1" in capsys.readouterr().err
    assert si(1.6e19, "FLOP") == "16.0 EFLOP"
    for config in ({"model_type": "gpt_neo", "hidden_size": 2048, "num_heads": 16, "num_layers": 24,
                    "vocab_size": 50257, "intermediate_size": None},
                   {"model_type": "codegen", "n_embd": 1024, "n_head": 16, "n_layer": 20, "vocab_size": 51200,
                    "n_inner": None}):  # ungated, a null width meaning 4 x hidden (they were refused as missing it)
        model = parse_hf_config(config)
        assert not model.gated_mlp and model.intermediate_size == 4 * model.hidden_size


def test_moe_layer_frequency_counts_as_each_family_does() -> None:
    """DeepSeek's moe_layer_freq makes layer i a MoE layer when i % freq == 0, Qwen's decoder_sparse_step when
    (i + 1) % step == 0; both were counted Qwen's way (27 layers, step 2: 13 MoE layers for DeepSeek, not 14)."""
    from deepgemm.analysis.hf_config import parse_hf_config

    base = {"hidden_size": 1024, "num_attention_heads": 8, "intermediate_size": 4096, "num_hidden_layers": 27,
            "vocab_size": 1000, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512}
    deepseek = parse_hf_config({**base, "model_type": "deepseek_v2", "moe_layer_freq": 2, "first_k_dense_replace": 0})
    qwen = parse_hf_config({**base, "model_type": "qwen2_moe", "decoder_sparse_step": 2})
    assert deepseek.moe is not None and qwen.moe is not None
    assert (deepseek.moe.num_moe_layers(27), qwen.moe.num_moe_layers(27)) == (14, 13)



@pytest.mark.parametrize(("experts", "step", "moe_layers", "gflop"), [(16, 1, 48, 32.276), (128, 2, 24, 32.299)])
def test_llama4_reads_the_shared_expert_interleave_and_dense_width(experts: int, step: int, moe_layers: int,
                                                                   gflop: float) -> None:
    """Llama 4 Scout / Maverick came out at two-thirds of their size: the shared expert was dropped and
    interleave_moe_layer_step / intermediate_size_mlp ignored. By hand, per decoded token (linear layers and the LM
    head): attention 2 * (7168 + 5120) * 5120, each MoE layer one routed and one shared SwiGLU expert of width 8192
    plus the router, each dense layer a SwiGLU MLP of width 16384 (17.2B active parameters for Scout)."""
    from deepgemm.analysis.gemms import Workload, enumerate_gemms
    from deepgemm.analysis.hf_config import parse_hf_config
    from deepgemm.analysis.ops import ATTENTION_CORE

    text = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
            "intermediate_size_mlp": 16384, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
            "num_hidden_layers": 48, "vocab_size": 202048, "num_local_experts": experts, "num_experts_per_tok": 1,
            "interleave_moe_layer_step": step}
    model = parse_hf_config({"model_type": "llama4", "text_config": text})
    assert model.moe is not None and model.moe.num_shared_experts == 1 and model.intermediate_size == 16384
    assert model.moe.num_moe_layers(48) == moe_layers
    ops = enumerate_gemms(model, Workload(batch=1, seq=16, decode_tokens=1, include_prefill=False))
    flops = sum(op.flops for op in ops if op.category != ATTENTION_CORE)
    h = 5120
    by_hand = (48 * 2 * (7168 + h) * h + moe_layers * (2 * experts * h + 2 * 2 * 3 * h * 8192)
               + (48 - moe_layers) * 2 * 3 * h * 16384 + 2 * 202048 * h)
    assert flops == by_hand and round(flops / 1e9, 3) == gflop


def test_what_the_analysis_does_not_read_is_noted() -> None:
    """An unknown family was analysed as SwiGLU, a sliding window and an int4 quantization were ignored, all
    without a word."""
    from deepgemm.analysis.hf_config import parse_hf_config

    base = {"hidden_size": 1024, "num_attention_heads": 8, "intermediate_size": 4096, "num_hidden_layers": 2,
            "vocab_size": 1000}
    assert parse_hf_config({**base, "model_type": "llama"}).notes == ()
    assert parse_hf_config({**base, "model_type": "qwen2", "sliding_window": 4096,
                            "use_sliding_window": False}).notes == ()
    (unknown,) = parse_hf_config({**base, "model_type": "nemotron"}).notes
    assert "'nemotron' is not a family deepgemm knows" in unknown
    notes = parse_hf_config({**base, "model_type": "mistral", "sliding_window": 4096,
                             "quantization_config": {"quant_method": "awq", "bits": 4}}).notes
    assert any("sliding_window 4096" in n for n in notes) and any("(awq)" in n for n in notes)
