"""`deepgemm bench --model` without a GPU: the block's layers, routing, modules (reference path), tables and CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from deepgemm.analysis.models import ModelSpec, MoeSpec
from deepgemm.analysis.presets import resolve_model
from deepgemm.bench import block_report, block_runner, console
from deepgemm.bench.block_impls import BF16, BLOCKWISE, DEEPGEMM, DeepgemmBlock
from deepgemm.bench.block_layers import DECODE_MAX_TOKENS, BlockPlan, RoutingPlan, block_plan, parse_tokens
from deepgemm.bench.block_modules import Bf16GroupedExperts, CublasBlockwiseLinear, DeepgemmExperts, bf16_linear
from deepgemm.bench.block_results import DIFF_LIMIT, BlockResults, LayerResult, Timed, TokenResult
from deepgemm.bench.block_runner import BlockSettings, run_block_bench
from deepgemm.bench.block_tensors import ExpertWeights, Routing, make_weights
from deepgemm.commands import bench
from deepgemm.tuning.timing import Timing
from deepgemm.utils import calc_diff

pytestmark = pytest.mark.usefixtures("small_fp8_route")  # small layers take the FP8 path

TINY_MOE = ModelSpec("tiny-moe", hidden_size=512, intermediate_size=1024, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=128, vocab_size=1000,
                     moe=MoeSpec(num_experts=4, experts_per_token=2, expert_intermediate_size=256, num_shared_experts=1,
                                 shared_intermediate_size=512))


def shapes(plan: BlockPlan) -> dict[str, tuple[int, int, int]]:
    return {layer.name: layer.shape for layer in plan.layers}


# -- the block's layers -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens", [1, 64, 4096])
def test_llama_3_8b_dense_block(tokens: int) -> None:
    plan = block_plan(resolve_model("llama-3-8b"), tokens)
    assert plan.kind == "dense" and plan.routing is None
    assert plan.phase == ("decode" if tokens <= DECODE_MAX_TOKENS else "prefill")
    assert shapes(plan) == {
        "attn.qkv_proj": (tokens, (32 + 2 * 8) * 128, 4096),
        "attn.o_proj": (tokens, 4096, 4096),
        "mlp.gate_up_proj": (tokens, 2 * 14336, 4096),
        "mlp.down_proj": (tokens, 4096, 14336),
    }
    assert plan.layer("mlp.down_proj").source == "mlp.gate_up_proj"
    assert all(layer.source is None for layer in plan.layers if layer.name != "mlp.down_proj")


@pytest.mark.parametrize("tokens", [1, 64, 100, 200, 4096])
def test_qwen3_30b_a3b_moe_block(tokens: int) -> None:
    plan = block_plan(resolve_model("qwen3-30b-a3b"), tokens)
    rows = tokens * 8
    assert plan.kind == "MoE"
    assert shapes(plan) == {
        "attn.qkv_proj": (tokens, (32 + 2 * 4) * 128, 2048),
        "attn.o_proj": (tokens, 2048, 32 * 128),
        "moe.router": (tokens, 128, 2048),
        "moe.experts.gate_up_proj": (rows, 2 * 768, 2048),
        "moe.experts.down_proj": (rows, 2048, 768),
    }
    experts = [layer for layer in plan.layers if layer.kind == "experts"]
    assert [layer.experts for layer in experts] == [128, 128]
    assert {layer.module for layer in experts} == {"moe.experts"}
    assert experts[1].source == experts[0].name
    assert all(layer.active_experts == min(128, rows) for layer in experts)
    routing = plan.routing
    assert routing is not None and routing.rows == rows and sum(routing.counts) == rows
    assert max(routing.counts) - min(routing.counts) <= 1  # balanced
    assert routing.counts[0] == -(-rows // 128)
    if tokens <= DECODE_MAX_TOKENS:
        assert routing.form == "masked" and routing.max_m % 64 == 0 and routing.max_m >= tokens
        assert routing.max_m == (64 if tokens <= 64 else 128) and routing.kernel_rows == 128 * routing.max_m
        assert routing.expected_m == (rows + 128) // 128
    else:
        assert routing.form == "contiguous"
        assert routing.padded_rows == sum(-(-c // 128) * 128 for c in routing.counts if c)
        assert routing.padded_rows % 128 == 0
    if tokens == 4096:
        assert set(routing.counts) == {256} and routing.padded_rows == rows  # already aligned, no padding
    if tokens == 200:
        assert set(routing.counts) == {12, 13} and routing.padded_rows == 128 * 128


def test_deepseek_v3_mla_moe_block() -> None:
    model = resolve_model("deepseek-v3")
    decode, prefill = block_plan(model, 64), block_plan(model, 4096)
    assert shapes(decode) == {
        "attn.q_a_proj+kv_a_proj": (64, 1536 + 512 + 64, 7168),
        "attn.q_b_proj": (64, 128 * 192, 1536),
        "attn.o_proj": (64, 7168, 128 * 128),
        "moe.router": (64, 256, 7168),
        "moe.experts.gate_up_proj": (512, 4096, 7168),
        "moe.experts.down_proj": (512, 7168, 2048),
        "moe.shared_experts.gate_up_proj": (64, 4096, 7168),
        "moe.shared_experts.down_proj": (64, 7168, 2048),
    }
    assert prefill.layer("attn.kv_b_proj").shape == (4096, 128 * 256, 512)  # prefill expands the latent
    assert not any(layer.category == "dense MLP" for layer in prefill.layers)  # the MoE layer is timed
    assert prefill.layer("moe.shared_experts.down_proj").source == "moe.shared_experts.gate_up_proj"
    assert prefill.layer("moe.experts.down_proj").source == "moe.experts.gate_up_proj"
    assert block_plan(model, 1).layer("moe.experts.gate_up_proj").active_experts == 8


def test_routing_tensors_are_balanced_and_padded() -> None:
    plan = RoutingPlan(tokens=70, experts=8, top_k=3, form="contiguous")
    routing = Routing.build(plan, "cpu")
    assert routing.token_of_row.shape == (210,)
    # every token is routed to top_k distinct experts, and row r goes where the plan says
    pairs = {(int(t), int(e)) for t, e in zip(routing.token_of_row, routing.expert_of_row)}
    assert len(pairs) == 210
    assert all(plan.expert_of(t, j) in {e for tt, e in pairs if tt == t} for t in range(70) for j in range(3))
    assert [rows for _, _, rows in routing.segments] == list(plan.counts)
    assert routing.offs.tolist() == torch.cumsum(torch.tensor(plan.counts), 0).tolist()
    # contiguous: every expert's segment starts at a multiple of 128, padding rows are -1
    m_indices = routing.m_indices
    assert m_indices.shape == (plan.padded_rows,) and plan.padded_rows == 8 * 128
    assert int((m_indices >= 0).sum()) == 210
    for expert, start, rows in routing.segments:
        dest = routing.padded_dest[start:start + rows]
        assert dest[0] == expert * 128 and (dest.diff() == 1).all()
        assert (m_indices[dest] == expert).all()
    # masked: expert e's rows are rows e * max_m ... of the [E * max_m] view; max_m covers every token
    assert plan.max_m == 128
    for expert, start, rows in routing.segments:
        assert routing.masked_dest[start:start + rows].tolist() == list(range(expert * 128, expert * 128 + rows))
    assert routing.masked_m.tolist() == list(plan.counts)


def test_tokens_parsing_and_block_plan_validation() -> None:
    assert parse_tokens("1,64,4096") == (1, 64, 4096)
    assert parse_tokens("64, 64,1") == (64, 1)
    for bad in ("", "1,,2", "x", "0", "-3", "1.5"):
        with pytest.raises(ValueError):
            parse_tokens(bad)
    with pytest.raises(ValueError, match="--tokens"):
        block_plan(TINY_MOE, 0)


# -- modules on the CPU reference path -------------------------------------------------------------------------

def _reference_experts(tokens: torch.Tensor, routing: Routing, weights: ExpertWeights) -> torch.Tensor:
    """float64: for every routed row (in routing order), down(silu(gate) * up) with its expert's BF16 weights."""
    x = tokens.double()[routing.token_of_row]
    out = torch.empty((x.shape[0], weights.down.shape[1]), dtype=torch.float64)
    for expert, start, rows in routing.segments:
        h = x[start:start + rows] @ weights.gate_up[expert].double().t()
        gate, up = h.chunk(2, dim=-1)
        out[start:start + rows] = (F.silu(gate) * up) @ weights.down[expert].double().t()
    return out


@pytest.mark.parametrize("form", ["masked", "contiguous"])
def test_deepgemm_experts_match_a_float64_reference(form: str) -> None:
    plan = block_plan(TINY_MOE, 40)  # 80 rows over 4 experts
    weights = make_weights(TINY_MOE, [plan], "cpu", seed=3)
    assert weights.experts is not None
    experts = DeepgemmExperts(weights.experts.gate_up_fp8, weights.experts.down_fp8)
    assert experts.backend == "reference"
    routing = Routing.build(plan.routing, "cpu")  # type: ignore[arg-type]
    tokens = torch.randn(40, 512, generator=torch.Generator().manual_seed(1)).bfloat16()
    layout = experts.layout(routing, form)  # type: ignore[arg-type]
    with torch.inference_mode():
        out = experts(experts.dispatch(tokens, layout), layout)
        rows = experts.routed_rows(out, layout)
    reference = _reference_experts(tokens, routing, weights.experts)
    assert rows.shape == reference.shape
    assert calc_diff(rows.float(), reference) < 5e-3
    if form == "contiguous":
        padding = routing.m_indices < 0
        assert padding.any() and (out[padding] == 0).all()


def test_bf16_experts_and_fp8_linear_match_float64() -> None:
    plan = block_plan(TINY_MOE, 40)
    weights = make_weights(TINY_MOE, [plan], "cpu", seed=5)
    assert weights.experts is not None
    routing = Routing.build(plan.routing, "cpu")  # type: ignore[arg-type]
    tokens = torch.randn(40, 512, generator=torch.Generator().manual_seed(2)).bfloat16()
    bf16 = Bf16GroupedExperts(weights.experts.gate_up, weights.experts.down)
    with torch.inference_mode():
        out = bf16(bf16.dispatch(tokens, routing), routing)
    assert calc_diff(out.float(), _reference_experts(tokens, routing, weights.experts)) < 1e-4

    implementation = DeepgemmBlock(weights, {})
    qkv = implementation.modules["attn.qkv_proj"]
    assert implementation.backend(plan.layer("attn.qkv_proj")) == "reference"
    x = torch.randn(40, 512).bfloat16()
    with torch.inference_mode():
        y = qkv(x)
    assert calc_diff(y.float(), x.double() @ weights.linear["attn.qkv_proj"].double().t()) < 5e-3


def test_cublas_blockwise_pads_weight_scales_to_4_k_blocks() -> None:
    weight = torch.randn(256, 768).bfloat16()
    module = CublasBlockwiseLinear.from_linear(bf16_linear(weight))
    assert module.weight.shape == (256, 768) and module.weight_scale_inv.shape == (2, 8)
    assert (module.weight_scale_inv[:, 6:] == 1).all() and (module.weight_scale_inv[:, :6] > 0).all()
    assert CublasBlockwiseLinear.from_linear(bf16_linear(weight[:, :512])).weight_scale_inv.shape == (2, 4)


def test_weights_are_seeded_random_and_never_zero() -> None:
    plans = [block_plan(TINY_MOE, 8)]
    first, second = make_weights(TINY_MOE, plans, "cpu", 0), make_weights(TINY_MOE, plans, "cpu", 0)
    for name, weight in first.linear.items():
        assert torch.equal(weight, second.linear[name]) and weight.abs().min() >= 0 and weight.std() > 0
    assert first.experts is not None and first.experts.gate_up.shape == (4, 512, 512)
    assert first.experts.down.shape == (4, 512, 256) and first.experts.down.std() > 0
    assert not torch.equal(make_weights(TINY_MOE, plans, "cpu", 1).linear["attn.o_proj"],
                           first.linear["attn.o_proj"])


def test_run_block_bench_on_cpu_with_a_fake_timer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[int] = []

    def fake_interleaved(fns: list, **_: Any) -> list[Timing]:
        calls.append(len(fns))
        for fn in fns:
            fn()  # the timed callables must run
        return [Timing.from_samples([100.0 + 10 * i, 101.0 + 10 * i, 102.0 + 10 * i]) for i in range(len(fns))]

    monkeypatch.setattr(block_runner, "bench_gpu_interleaved", fake_interleaved)
    results = run_block_bench(TINY_MOE, [8, 200], BlockSettings(iters=3, warmup=0), device="cpu")
    assert [r.tokens for r in results.results] == [8, 200]
    assert [r.routing.form for r in results.results] == ["masked", "contiguous"]  # type: ignore[union-attr]
    for result in results.results:
        assert list(result.block) == [DEEPGEMM, BF16, BLOCKWISE]
        assert result.block[DEEPGEMM].ok and result.block[BF16].ok
        assert result.block[BLOCKWISE].status in ("ok", "refused")  # cuBLAS has no CPU block-wise FP8
        assert [layer.layer.name for layer in result.layers][:3] == ["attn.qkv_proj", "attn.o_proj", "moe.router"]
        for layer in result.layers:
            ours = layer.times[DEEPGEMM]
            assert ours.ok and ours.calc_diff is not None and ours.calc_diff < DIFF_LIMIT, layer.layer.name
            assert layer.backend == ("bf16" if layer.layer.kind == "router" else "reference")
        assert result.speedup(BF16) == pytest.approx(110.0 / 100.0, rel=0.05)
        assert result.our_kernel_share() == 0.0  # reference path: nothing ran in deepgemm's kernels
    assert results.exit_code == 0
    path = tmp_path / "block.json"
    results.save(path)
    document = json.loads(path.read_text())
    assert document["format"] == "deepgemm-bench-block" and document["model"]["block"] == "MoE"
    entry = document["results"][1]
    assert entry["moe"]["form"] == "contiguous" and entry["moe"]["kernel_rows"] == 512
    assert {layer["name"] for layer in entry["layers"]} >= {"moe.experts.gate_up_proj", "moe.experts.down_proj"}
    assert entry["block"]["deepgemm"]["samples"] == 3


# -- tables -------------------------------------------------------------------------------------------------------

def _fake_results(model_name: str, tokens: list[int]) -> tuple[BlockResults, list[BlockPlan]]:
    model = resolve_model(model_name)
    plans = [block_plan(model, t) for t in tokens]
    impls = [DEEPGEMM, BF16, BLOCKWISE]
    results = []
    for plan in plans:
        def timed(scale: float, index: int) -> Timed:
            if index == 2 and plan.tokens == 1:
                return Timed("refused", reason="RuntimeError: cuBLAS refuses M = 1 (1x2112x7168)")
            value = 123456.7 * scale
            return Timed("ok", value, value * 0.99, value * 1.01, value * 0.98, 30, True, 1.2e-3)

        layers = [LayerResult(layer, "bf16" if layer.kind == "router" else "sm90",
                              {impl: timed(1 + i / 10, i) for i, impl in enumerate(impls)}) for layer in plan.layers]
        block_times = {impl: timed(10 + i, i) for i, impl in enumerate(impls)}
        results.append(TokenResult(plan.tokens, plan.phase, plan.routing, block_times, layers))
    return BlockResults(model, impls, {}, BlockSettings().to_json(), {}, results), plans


@pytest.mark.parametrize("plain", [False, True])
def test_tables_fit_100_columns(plain: bool, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    if plain:
        monkeypatch.setattr(console, "_rich_console", lambda: None)
    results, plans = _fake_results("deepseek-v3", [1, 64, 4096])
    impls = results.implementations
    for result in results.results:
        console.print_table("layers", block_report.layer_headers(impls), block_report.layer_rows(result))
    console.print_table("summary", block_report.SUMMARY_HEADERS, block_report.summary_rows(results))
    for plan in plans:
        console.print_table("plan", block_report.PLAN_HEADERS, block_report.plan_rows(plan))
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100, out
    assert "experts.gate_up_proj" in out and "refused" in out and "32768x4096x7168" in out


def test_report_contents(capsys: pytest.CaptureFixture[str]) -> None:
    results, plans = _fake_results("qwen3-30b-a3b", [1, 4096])
    block_report.print_results(results, plans)
    out = capsys.readouterr().out
    assert "masked layout, max_m = 64" in out and "contiguous layout" in out
    assert "quantize_per_token_group" in out and "torch._grouped_mm" in out
    assert "1 tokens: cublas-blockwise's block refused" in out
    share = results.results[1].our_kernel_share()
    assert share is not None and share == pytest.approx(4 / 5)  # five equal layers, all but the router in ours
    assert f"{100 * share:.1f}% of its block's GEMM time" in out and "elsewhere: moe.router (bf16)" in out
    rows = block_report.summary_rows(results)
    deepgemm_row = next(row for row in rows if row[0] == "4096" and row[1] == DEEPGEMM)
    bf16_row = next(row for row in rows if row[0] == "4096" and row[1] == BF16)
    assert deepgemm_row[2] == f"{1234.567:.3f}" and bf16_row[5] == "1.10x" and deepgemm_row[6].endswith("%")
    assert deepgemm_row[4] == f"{4096 / 1.234567:,.0f}"


# -- command line -------------------------------------------------------------------------------------------------

def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="deepgemm")
    sub = parser.add_subparsers(dest="command", required=True)
    bench.register(sub)
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.fixture()
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "cuda_device_problem", lambda: "no CUDA GPU (test)")


def test_cli_without_gpu_lists_the_layers(no_gpu: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out.json"
    assert run("bench", "--model", "qwen3-30b-a3b", "--json", str(path)) == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU (test)" in out and "nothing can be timed" in out
    assert "experts.gate_up_proj" in out and "m_grouped_masked" in out and "m_grouped_contiguous" in out
    assert "1 tokens (decode)" in out and "64 tokens (decode)" in out and "4096 tokens (prefill)" in out
    assert "--json: not written" in out and not path.exists()
    assert run("bench", "--model", "llama-3-8b", "--tokens", "256") == 0
    assert "mlp.gate_up_proj" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--model", "no-such-model"), "argument --model: unknown model 'no-such-model'"),
        (("--tokens", "64"), "argument --tokens: needs --model"),
        (("--model", "llama-3-8b", "--skip", "cublas-fp8-tensor"), "argument --skip"),
        (("--model", "llama-3-8b", "--dtype", "bf16"), "argument --model: not with --dtype bf16"),
        (("--model", "llama-3-8b", "--compare", "x.json"), "argument --model: not with --compare"),
    ],
)
def test_cli_bad_input_exits_2(argv: tuple[str, ...], message: str, no_gpu: None,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert run("bench", *argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_malformed_config_exits_2(tmp_path: Path, no_gpu: None, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{\"hidden_size\": 12,")
    assert run("bench", "--model", str(bad)) == 2
    assert "argument --model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--model", "llama-3-8b", "--tokens", "1,x"), "argument --tokens"),
        (("--model", "llama-3-8b", "--tokens", "0"), "argument --tokens"),
        (("--model", "llama-3-8b", "--shape", "64,4096,4096"), "not allowed with argument"),
        (("--model", "llama-3-8b", "--suite", "smoke"), "not allowed with argument"),
    ],
)
def test_cli_argument_errors_exit_2(argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run("bench", *argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
