"""Built-in model presets (published hyper-parameters) and name-or-path lookup."""

from __future__ import annotations

from pathlib import Path

from deepgemm.analysis.hf_config import load_hf_config
from deepgemm.analysis.models import MlaSpec, ModelConfigError, ModelSpec, MoeSpec

PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("llama-3-8b", hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                  num_kv_heads=8, head_dim=128, vocab_size=128256),
        ModelSpec("llama-3-70b", hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64,
                  num_kv_heads=8, head_dim=128, vocab_size=128256),
        ModelSpec("llama-3.1-405b", hidden_size=16384, intermediate_size=53248, num_layers=126, num_heads=128,
                  num_kv_heads=8, head_dim=128, vocab_size=128256),
        ModelSpec("qwen2.5-7b", hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
                  num_kv_heads=4, head_dim=128, vocab_size=152064),
        ModelSpec("mixtral-8x7b", hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                  num_kv_heads=8, head_dim=128, vocab_size=32000,
                  moe=MoeSpec(num_experts=8, experts_per_token=2, expert_intermediate_size=14336)),
        ModelSpec("qwen3-30b-a3b", hidden_size=2048, intermediate_size=6144, num_layers=48, num_heads=32,
                  num_kv_heads=4, head_dim=128, vocab_size=151936,
                  moe=MoeSpec(num_experts=128, experts_per_token=8, expert_intermediate_size=768)),
        ModelSpec("deepseek-v3", hidden_size=7168, intermediate_size=18432, num_layers=61, num_heads=128,
                  num_kv_heads=128, head_dim=128, vocab_size=129280,
                  mla=MlaSpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                              v_head_dim=128),
                  moe=MoeSpec(num_experts=256, experts_per_token=8, expert_intermediate_size=2048,
                              num_shared_experts=1, shared_intermediate_size=2048, first_dense_layers=3,
                              layer_offset=0),
                  notes=("the multi-token-prediction module (num_nextn_predict_layers=1) is not counted",)),
        ModelSpec("gpt-3-175b", hidden_size=12288, intermediate_size=49152, num_layers=96, num_heads=96,
                  num_kv_heads=96, head_dim=128, vocab_size=50257, gated_mlp=False, activation="gelu"),
    )
}


def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset by name, else a Hugging Face ``config.json`` (or a folder holding one).

    Raises ModelConfigError naming the preset list when neither fits.
    """
    key = name_or_path.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return load_hf_config(path)
    known = ", ".join(PRESETS)
    raise ModelConfigError(
        f"unknown model {name_or_path!r}: not a preset ({known}) and no config.json at that path")
