"""FLOPs and bytes of the GEMM enumeration against hand-computed values."""

from __future__ import annotations

import pytest

from deepgemm.analysis.gemms import enumerate_gemms, Workload
from deepgemm.analysis.ops import ATTENTION_CORE, GemmOp
from deepgemm.analysis.presets import PRESETS


def by_name(ops: list[GemmOp]) -> dict[str, GemmOp]:
    return {op.label: op for op in ops}


def decode_step(model: str, *, batch: int = 1, kv_len: int = 1024, **kwargs) -> list[GemmOp]:
    workload = Workload(batch=batch, seq=kv_len - 1, decode_tokens=1, include_prefill=False, **kwargs)
    return enumerate_gemms(PRESETS[model], workload)


def test_llama3_8b_decode_step_flops_by_hand() -> None:
    ops = by_name(decode_step("llama-3-8b"))
    expected = {
        "attn.qkv_proj": 2 * 1 * 6144 * 4096 * 32,  # (32 + 2*8) heads * 128 = 6144
        "attn.qk": 2 * 1 * 1024 * 128 * 32 * 32,  # 32 heads, 32 layers
        "attn.pv": 2 * 1 * 128 * 1024 * 32 * 32,
        "attn.o_proj": 2 * 1 * 4096 * 4096 * 32,
        "mlp.gate_up_proj": 2 * 1 * 28672 * 4096 * 32,
        "mlp.down_proj": 2 * 1 * 4096 * 14336 * 32,
        "lm_head": 2 * 1 * 128256 * 4096,
    }
    assert {name: op.flops for name, op in ops.items()} == expected
    assert sum(expected.values()) == 15_546_187_776


def test_llama3_8b_decode_step_bytes_by_hand() -> None:
    ops = by_name(decode_step("llama-3-8b"))
    qkv = ops["attn.qkv_proj"].traffic
    assert (qkv.a, qkv.b, qkv.d) == (4096, 6144 * 4096, 6144 * 2)  # fp8 in, bf16 out
    assert qkv.scales == 1 * 32 * 4 + 48 * 32 * 4  # 1x128 activation scales + 128x128 weight blocks
    qk = ops["attn.qk"].traffic  # bf16 Q of 32 heads, K cache of 8 KV heads x 1024 positions; scores on chip
    assert (qk.a, qk.b, qk.d, qk.scales) == (32 * 128 * 2, 8 * 1024 * 128 * 2, 0, 0)
    pv = ops["attn.pv"].traffic
    assert (pv.a, pv.b, pv.d) == (0, 8 * 128 * 1024 * 2, 32 * 128 * 2)
    lm_head = ops["lm_head"].traffic  # the LM head stays bf16
    assert lm_head.total == 4096 * 2 + 128256 * 4096 * 2 + 128256 * 2
    assert ops["attn.qkv_proj"].bytes == qkv.total * 32


def test_deepseek_v3_decode_step_flops_by_hand() -> None:
    ops = by_name(decode_step("deepseek-v3", kv_len=4096))
    layers, moe_layers, dense_layers = 61, 58, 3
    expected = {
        "attn.q_a_proj+kv_a_proj": 2 * (1536 + 512 + 64) * 7168 * layers,
        "attn.q_b_proj": 2 * 128 * 192 * 1536 * layers,
        "attn.q_absorb(W_UK)": 2 * 1 * 512 * 128 * 128 * layers,
        "attn.qk": 2 * 1 * 4096 * 576 * 128 * layers,
        "attn.pv": 2 * 1 * 512 * 4096 * 128 * layers,
        "attn.v_absorb(W_UV)": 2 * 1 * 128 * 512 * 128 * layers,
        "attn.o_proj": 2 * 7168 * 16384 * layers,
        "mlp.gate_up_proj": 2 * 36864 * 7168 * dense_layers,
        "mlp.down_proj": 2 * 7168 * 18432 * dense_layers,
        "moe.router": 2 * 256 * 7168 * moe_layers,
        "moe.experts.gate_up_proj": 2 * 8 * 4096 * 7168 * moe_layers,  # 8 routed rows, 1 per active expert
        "moe.experts.down_proj": 2 * 8 * 7168 * 2048 * moe_layers,
        "moe.shared_experts.gate_up_proj": 2 * 4096 * 7168 * moe_layers,
        "moe.shared_experts.down_proj": 2 * 7168 * 2048 * moe_layers,
        "lm_head": 2 * 129280 * 7168,
    }
    assert {name: op.flops for name, op in ops.items()} == expected
    assert expected["attn.qk"] == 36_842_766_336
    assert ops["moe.experts.gate_up_proj"].groups == 8


def test_deepseek_v3_decode_reads_the_latent_cache_once() -> None:
    """Absorbed MLA attends in the latent space: V is the first 512 columns of the latent rows attn.qk already
    reads, so attn.pv reads no cache (it counted the cache a second time: a 64 x 32768 decode step at ~199 ms
    instead of ~171 ms)."""
    ops = by_name(decode_step("deepseek-v3", kv_len=4096))
    qk, pv = ops["attn.qk"], ops["attn.pv"]
    assert qk.b.elements == 1 * 4096 * 576 and pv.b.elements == 0  # one sequence's latent + rope rows, once
    assert pv.flops == 2 * 1 * 512 * 4096 * 128 * 61


def test_deepseek_v3_prefill_uses_kv_b_proj_and_192_dim_heads() -> None:
    ops = by_name(enumerate_gemms(PRESETS["deepseek-v3"], Workload(batch=2, seq=1024)))
    assert (ops["attn.kv_b_proj"].m, ops["attn.kv_b_proj"].n, ops["attn.kv_b_proj"].k) == (2048, 32768, 512)
    assert (ops["attn.qk"].m, ops["attn.qk"].n, ops["attn.qk"].k, ops["attn.qk"].batch) == (1024, 1024, 192, 256)
    assert (ops["attn.pv"].n, ops["attn.pv"].k) == (128, 1024)
    experts = ops["moe.experts.gate_up_proj"]
    assert (experts.m, experts.groups, experts.m_per_group) == (2048 * 8, 256, 64.0)
    assert ops["lm_head"].m == 2  # last position of each sequence only


# Published parameter counts minus what is not a GEMM weight (embeddings, norms, biases).
PUBLISHED_GEMM_WEIGHTS = {
    "llama-3-8b": 8_030_261_248 - 128256 * 4096 - (2 * 32 + 1) * 4096,
    "llama-3-70b": 70_553_706_496 - 128256 * 8192 - (2 * 80 + 1) * 8192,
    "llama-3.1-405b": 405_853_388_800 - 128256 * 16384 - (2 * 126 + 1) * 16384,
    "qwen2.5-7b": 7_615_616_512 - 152064 * 3584 - (2 * 28 + 1) * 3584 - 28 * (3584 + 2 * 512),
    "mixtral-8x7b": 46_702_792_704 - 32000 * 4096 - (2 * 32 + 1) * 4096,
    "qwen3-30b-a3b": 30_532_122_624 - 151936 * 2048 - 48 * (2 * 2048 + 2 * 128) - 2048,
    "deepseek-v3": 671_026_419_200 - 129280 * 7168 - 61 * (2 * 7168 + 1536 + 512) - 7168 - 58 * 256,
    "gpt-3-175b": 96 * (4 * 12288 * 12288 + 2 * 12288 * 49152) + 50257 * 12288,
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_weight_elements_of_every_preset_match_published_sizes(name: str) -> None:
    """A prefill long enough to reach every expert reads each GEMM weight exactly once per layer."""
    ops = enumerate_gemms(PRESETS[name], Workload(batch=1, seq=512, precision="bf16"))
    weights = sum(op.b.elements * op.count for op in ops if op.category != ATTENTION_CORE)
    assert weights == PUBLISHED_GEMM_WEIGHTS[name]


ACTIVE_GEMM_WEIGHTS = {  # per token: attention + top-k experts (+ shared) + router + LM head
    "mixtral-8x7b": 32 * (4096 * 6144 + 4096 * 4096 + 2 * 3 * 4096 * 14336 + 8 * 4096) + 32000 * 4096,
    "qwen3-30b-a3b": 48 * (2048 * 5120 + 4096 * 2048 + 8 * 3 * 2048 * 768 + 128 * 2048) + 151936 * 2048,
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_single_token_decode_flops_are_twice_the_active_weights(name: str) -> None:
    ops = decode_step(name)
    linear_flops = sum(op.flops for op in ops if op.category != ATTENTION_CORE)
    expected = ACTIVE_GEMM_WEIGHTS.get(name, PUBLISHED_GEMM_WEIGHTS[name])
    if name == "deepseek-v3":  # 8 of 256 experts; kv_b_proj's weights applied per head as W_UK / W_UV (projections)
        expected = PUBLISHED_GEMM_WEIGHTS[name] - 58 * 248 * 3 * 7168 * 2048
    assert linear_flops == 2 * expected


def test_training_step_is_three_times_its_forward() -> None:
    ops = enumerate_gemms(PRESETS["mixtral-8x7b"], Workload(batch=2, seq=256, train=True))
    forward = sum(op.flops for op in ops if op.pass_ == "forward")
    assert sum(op.flops for op in ops) == 3 * forward
    by_label = by_name(ops)
    assert by_label["lm_head"].m == 512  # training computes every position's logits
    down = by_label["mlp.down_proj"] if "mlp.down_proj" in by_label else by_label["moe.experts.down_proj"]
    dgrad, wgrad = by_label[f"{down.name} [dgrad]"], by_label[f"{down.name} [wgrad]"]
    assert (dgrad.m, dgrad.n, dgrad.k) == (down.m, down.k, down.n)
    assert (wgrad.m, wgrad.n, wgrad.k) == (down.n, down.k, down.m)  # K-grouped over the experts' rows
    assert wgrad.traffic.d == down.b.elements * 4  # fp32 weight gradients


def test_tensor_parallel_splits_heads_and_widths() -> None:
    ops = by_name(enumerate_gemms(PRESETS["llama-3-70b"], Workload(seq=128, tp=8)))
    assert ops["attn.qkv_proj"].n == (8 + 2 * 1) * 128
    assert ops["attn.o_proj"].k == 8 * 128
    assert ops["mlp.down_proj"].k == 28672 // 8
    assert ops["lm_head"].n == 128256 // 8
    replicated = by_name(enumerate_gemms(PRESETS["llama-3-70b"], Workload(seq=128, tp=16)))
    assert replicated["attn.qkv_proj"].n == (4 + 2 * 1) * 128  # 8 KV heads over 16 ranks: one each, replicated
    with pytest.raises(ValueError, match="--tp"):
        enumerate_gemms(PRESETS["llama-3-70b"], Workload(seq=128, tp=3))


def test_unfused_and_ungated_variants() -> None:
    split = by_name(enumerate_gemms(PRESETS["qwen2.5-7b"], Workload(seq=64, fused=False)))
    assert [split[f"attn.{p}_proj"].n for p in "qkv"] == [3584, 512, 512]
    assert split["mlp.gate_proj"].n == split["mlp.up_proj"].n == 18944
    gpt = by_name(enumerate_gemms(PRESETS["gpt-3-175b"], Workload(seq=64)))
    assert "mlp.gate_up_proj" not in gpt and gpt["mlp.up_proj"].n == 49152


def test_mixtral_routing_is_balanced_over_active_experts() -> None:
    ops = by_name(decode_step("mixtral-8x7b", batch=3))
    experts = ops["moe.experts.gate_up_proj"]
    assert (experts.m, experts.groups) == (6, 6)  # 3 tokens x top-2 rows reach 6 of 8 experts
    assert experts.traffic.b == 6 * 28672 * 4096


def test_workload_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="--batch"):
        Workload(batch=0)
    with pytest.raises(ValueError, match="--train"):
        Workload(train=True, decode_tokens=1)


def test_fp8_tensor_parallel_splits_that_cut_scale_blocks_are_noted() -> None:
    """Qwen3-30B-A3B at tp 4 shards its 768-wide experts into 192 columns: not whole 128x128 FP8 blocks, which
    engines pad or refuse; the analysis said nothing."""
    from deepgemm.analysis.gemms import assumptions

    notes = assumptions(PRESETS["qwen3-30b-a3b"], Workload(batch=1, seq=16, tp=4))
    assert any("expert width 768 / 4 = 192" in note for note in notes)
    assert not any("128x128 FP8 blocks" in note for note in assumptions(PRESETS["deepseek-v3"],
                                                                         Workload(batch=1, seq=16, tp=8)))
    assert not any("128x128 FP8 blocks" in note for note in assumptions(PRESETS["qwen3-30b-a3b"],
                                                                         Workload(batch=1, seq=16, tp=4,
                                                                                  precision="bf16")))
