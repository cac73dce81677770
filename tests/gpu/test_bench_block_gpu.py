"""`deepgemm bench --model` on a real Hopper GPU: every implementation's block runs, deepgemm on its own kernels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepgemm.analysis.presets import resolve_model
from deepgemm.bench.block_impls import BF16, BLOCKWISE, DEEPGEMM
from deepgemm.bench.block_results import DIFF_LIMIT, TokenResult
from deepgemm.bench.block_runner import BlockSettings, run_block_bench

pytestmark = pytest.mark.gpu

FEW = BlockSettings(iters=5, warmup=1)


def check_deepgemm(result: TokenResult) -> None:
    ours = result.block[DEEPGEMM]
    assert ours.ok and ours.samples == 5 and ours.cuda_graph, ours.reason
    for layer in result.layers:
        timed = layer.times[DEEPGEMM]
        assert timed.ok, f"{result.tokens} tokens, {layer.layer.name}: {timed.reason}"
        assert timed.cuda_graph, f"{layer.layer.name} fell back to eager launches"
        assert timed.calc_diff is not None and timed.calc_diff < DIFF_LIMIT, (layer.layer.name, timed.calc_diff)
        expected = "bf16" if layer.layer.kind == "router" else "sm90"
        assert layer.backend == expected, (layer.layer.name, layer.backend)


def test_dense_block(tmp_path: Path) -> None:
    results = run_block_bench(resolve_model("llama-3-8b"), [64], FEW)
    (result,) = results.results
    assert result.phase == "decode" and list(result.block) == [DEEPGEMM, BF16, BLOCKWISE]
    assert [layer.layer.name for layer in result.layers] == ["attn.qkv_proj", "attn.o_proj", "mlp.gate_up_proj",
                                                            "mlp.down_proj"]
    check_deepgemm(result)
    assert result.block[BF16].ok and result.block[BLOCKWISE].ok, result.block[BLOCKWISE].reason
    assert result.speedup(BF16) is not None and result.speedup(BLOCKWISE) is not None
    share = result.our_kernel_share()
    assert share is not None and share > 0.99  # no layer of Llama-3-8B is routed to BF16
    path = tmp_path / "block.json"
    results.save(path)
    document = json.loads(path.read_text())
    assert document["results"][0]["layers"][2]["backend"] == "sm90"


def test_moe_block_masked_decode_and_contiguous_prefill() -> None:
    results = run_block_bench(resolve_model("qwen3-30b-a3b"), [16, 512], FEW)
    decode, prefill = results.results
    assert decode.routing is not None and decode.routing.form == "masked"
    assert prefill.routing is not None and prefill.routing.form == "contiguous"
    for result in (decode, prefill):
        check_deepgemm(result)
        assert any(layer.layer.kind == "experts" for layer in result.layers)
        # the BF16 peer's experts need torch._grouped_mm; cuBLAS block-wise may refuse a shape, never error
        assert result.block[BF16].status in ("ok", "n/a"), result.block[BF16].reason
        assert result.block[BLOCKWISE].status in ("ok", "refused"), result.block[BLOCKWISE].reason
        share = result.our_kernel_share()
        assert share is not None and share > 0.5  # everything but the BF16 router
