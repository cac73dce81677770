"""Custom ops and deepgemm.nn on an sm_90 GPU: opcheck, torch.compile (inductor, dynamic M, reduce-overhead),
CUDA-graph capture of a converted model, the warm-up error for a cold shape inside capture. The reference path is
disabled here, so every number comes from our kernels."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn

import deepgemm
import deepgemm.api.gemm as api_gemm
import deepgemm.api.grouped as api_grouped
import deepgemm.api.kgrouped as api_kgrouped
import deepgemm.api.quant as api_quant
from deepgemm.nn import Fp8Linear, convert
from tests.op_cases import OP_NAMES, fp8_aware_allclose, op_cases

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("small_fp8_route")]


@pytest.fixture(autouse=True)
def _no_reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any use of the reference path fails the test: the results below are the kernels'."""
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the reference path ran on the GPU")
    for module, names in ((api_gemm, ("fp8_gemm_nt_reference",)),
                          (api_grouped, ("m_grouped_contiguous_reference", "m_grouped_masked_reference")),
                          (api_kgrouped, ("k_grouped_reference",)),
                          (api_quant, ("quantize_per_token_group_reference", "quantize_per_block_reference"))):
        for name in names:
            monkeypatch.setattr(module, name, refuse)


@pytest.mark.parametrize("name", OP_NAMES)
def test_opcheck_cuda(name: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "allclose", fp8_aware_allclose(torch.allclose))
    torch.library.opcheck(getattr(torch.ops.deepgemm, name).default, op_cases("cuda", seed)[name])


def _quantize_gemm_relu(x: torch.Tensor, w: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    return torch.relu(deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(x), (w, sw)))  # exact under fusion


def test_inductor_fullgraph_dynamic_m_on_cuda(seed: int) -> None:
    torch._dynamo.reset()
    w, sw = deepgemm.quantize_per_block(torch.randn(2112, 7168, device="cuda"))
    compiled = torch.compile(_quantize_gemm_relu, fullgraph=True, dynamic=True)
    for m in (3, 200, 4096):
        x = torch.randn(m, 7168, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(compiled(x, w, sw), _quantize_gemm_relu(x, w, sw))
    explained = torch._dynamo.explain(_quantize_gemm_relu)(x, w, sw)
    assert explained.graph_break_count == 0


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(2048, 4096, dtype=torch.bfloat16, device="cuda"), nn.ReLU(),
                         nn.Linear(4096, 2048, dtype=torch.bfloat16, device="cuda"))


def test_converted_model_matches_float64_reference(seed: int) -> None:
    model = _model()
    convert(model)
    x = torch.randn(77, 2048, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        y = model(x)
        first, second = model[0], model[2]
        assert first.backend(77) == "sm90" and second.backend(77) == "sm90"
        h = torch.relu(first(x))
        for layer, inp, got in ((first, x, first(x)), (second, h, y)):
            q, sf = deepgemm.quantize_per_token_group(inp)
            ref = deepgemm.dequantize_per_token_group(q, sf, dtype=torch.float64) @ deepgemm.dequantize_per_block(
                layer.weight, layer.weight_scale_inv, dtype=torch.float64).t() + layer.bias.double()
            assert deepgemm.calc_diff(got.double(), ref) < 1e-5


def test_reduce_overhead_mode_after_warmup(seed: int) -> None:
    torch._dynamo.reset()
    model = _model()
    convert(model)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.inference_mode():
        for _ in range(4):  # warm-up runs, then graph recording, then replays
            x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
            assert torch.equal(compiled(x).clone(), model(x))
    skips = torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)
    assert skips == 0, dict(torch._dynamo.utils.counters["inductor"])


def test_cuda_graph_capture_of_a_converted_model(seed: int) -> None:
    model = _model()
    convert(model)
    static_x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        model(static_x)  # warm-up: compile and load outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = model(static_x)
        for _ in range(3):
            static_x.copy_(torch.randn_like(static_x))
            graph.replay()
            assert torch.equal(static_y, model(static_x))


def test_cold_shape_inside_capture_raises_the_warm_up_error() -> None:
    layer = Fp8Linear.from_linear(nn.Linear(1536, 3072, dtype=torch.bfloat16, device="cuda"))
    x = torch.randn(8, 1536, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), pytest.raises(deepgemm.GraphCaptureError, match="warm|outside|before"):
        with torch.cuda.graph(graph):
            layer(x)


def test_grad_refusal_on_cuda() -> None:
    x = torch.randn(8, 512, device="cuda", requires_grad=True)
    with pytest.raises(deepgemm.NotDifferentiableError, match="'x' requires grad"):
        deepgemm.quantize_per_token_group(x)
    with pytest.raises(deepgemm.NotDifferentiableError):
        torch.ops.deepgemm.quantize_per_token_group(x)


def test_precompiled_model_compiles_nothing_when_served(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deepgemm.jit import compile_stats

    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))  # cold: nothing of the other tests' cache
    model = nn.Sequential(nn.Linear(1536, 2560, dtype=torch.bfloat16, device="cuda"), nn.ReLU(),
                          nn.Linear(2560, 1536, dtype=torch.bfloat16, device="cuda"))
    convert(model)
    tokens = (1, 16, 200, 4096)
    summary = deepgemm.precompile_model(model, tokens=tokens)
    assert summary.compiled > 0
    before = compile_stats()
    with torch.inference_mode():
        for t in tokens:
            model(torch.randn(t, 1536, device="cuda", dtype=torch.bfloat16))
    assert (compile_stats() - before).compiled == 0
