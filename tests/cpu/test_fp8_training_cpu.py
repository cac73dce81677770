"""FP8 training on CPU (the reference path): deepgemm.fp8_linear's forward and its three-GEMM backward against
float64, the transposed quantizer against the per-token-group reference, Fp8TrainingLinear, convert(training=True),
argument rules, torch.compile."""

from __future__ import annotations

import re
import sys

import pytest
import torch
from torch import nn

import deepgemm
from deepgemm.nn import Fp8TrainingLinear, convert
from deepgemm.ops.quant import quantize_both_ways, quantize_per_block_transposed, quantize_transposed
from deepgemm.reference import quantize_per_token_group_reference
from tests.fp8_training_helpers import (
    activations,
    quantized,
    train_step,
    transposed_padded,
    unquantized,
    weights,
)

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
fp8_linear_module = sys.modules["deepgemm.ops.fp8_linear"]  # (deepgemm.ops.fp8_linear is also the function's name)


@pytest.mark.parametrize("t,n,k,bias,x_dtype,w_dtype", [
    (1, 64, 128, True, BF16, FP32),
    (7, 48, 272, False, BF16, BF16),
    (129, 256, 128, True, FP32, FP32),
    (300, 80, 400, True, FP16, FP32),
    (256, 128, 256, False, BF16, FP32),
])
def test_fp8_linear_gradients_match_float64(t: int, n: int, k: int, bias: bool, x_dtype: torch.dtype,
                                            w_dtype: torch.dtype, seed: int) -> None:
    x, w = activations(t, k, x_dtype), weights(n, k, w_dtype)
    b = torch.randn(n, dtype=w_dtype) if bias else None
    dy = activations(t, n, x_dtype)
    y, dx, dw, db = train_step(x, w, b, dy)
    assert y.dtype == x_dtype and dx.dtype == x_dtype and dw.dtype == w_dtype
    want = quantized(x, w, b, dy)
    plain = unquantized(x, w, b, dy)
    for name, got, exact, approx in (("y", y, want.y, plain.y), ("dx", dx, want.dx, plain.dx),
                                     ("dw", dw, want.dw, plain.dw)):
        assert deepgemm.calc_diff(got.double(), exact) < 2e-5, name   # the quantized math, up to output rounding
        assert deepgemm.calc_diff(got.double(), approx) < 3e-3, name  # FP8 training's error against float64
        bound = 2.0**-7 * exact.abs().amax() + 1e-6
        assert (got.double() - exact).abs().amax() <= bound, name
    if bias:
        assert db.dtype == w_dtype
        torch.testing.assert_close(db.double(), want.db, rtol=1e-5 if w_dtype == FP32 else 8e-3, atol=1e-4)


def test_three_dimensional_input_and_partial_gradients(seed: int) -> None:
    x, w = activations(6 * 5, 256, BF16).view(6, 5, 256), weights(64, 256, FP32)
    dy = activations(30, 64, BF16)
    frozen = w.clone()  # no grad for W: only Dgrad runs
    xg = x.clone().requires_grad_()
    y = deepgemm.fp8_linear(xg, frozen)
    assert y.shape == (6, 5, 64)
    y.backward(dy.view(6, 5, 64))
    want = quantized(x.reshape(30, 256), w, None, dy)
    assert deepgemm.calc_diff(xg.grad.reshape(30, 256).double(), want.dx) < 2e-5
    wg = w.clone().requires_grad_()  # no grad for x: only Wgrad runs
    deepgemm.fp8_linear(x, wg).backward(dy.view(6, 5, 64))
    assert deepgemm.calc_diff(wg.grad.double(), want.dw) < 2e-5


def test_stride_zero_gradient_and_no_grad_forward(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, b = activations(50, 128, BF16), weights(32, 128, FP32), torch.randn(32)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    deepgemm.fp8_linear(xg, wg, b).sum().backward()  # dy: ones with strides (0, 0)
    want = quantized(x, w, b, torch.ones(50, 32, dtype=BF16))
    assert deepgemm.calc_diff(xg.grad.double(), want.dx) < 2e-5 and deepgemm.calc_diff(wg.grad.double(), want.dw) < 2e-5
    with_grad = deepgemm.fp8_linear(x, w.clone().requires_grad_(), b).detach()

    def refuse(*args: object) -> None:
        raise AssertionError("a forward without grad mode quantized x for a backward")

    monkeypatch.setattr(fp8_linear_module, "quantize_both_ways", refuse)
    monkeypatch.setattr(fp8_linear_module, "quantize_per_block_transposed", refuse)
    with torch.no_grad():
        assert torch.equal(deepgemm.fp8_linear(x, w.clone().requires_grad_(), b), with_grad)
    with torch.inference_mode():
        assert torch.equal(deepgemm.fp8_linear(x, w, b), with_grad)


def test_float32_output_of_bfloat16_activations(seed: int) -> None:
    """out_dtype=float32: the GEMM's FP32 result unrounded (a row-parallel layer's partial sums); dx keeps x's dtype."""
    x, w, dy = activations(70, 256, BF16), weights(48, 256, FP32), activations(70, 48, FP32)
    xg = x.clone().requires_grad_()
    y = deepgemm.fp8_linear(xg, w, out_dtype=FP32)
    y.backward(dy)
    want = quantized(x, w, None, dy)
    assert y.dtype == FP32 and xg.grad.dtype == BF16
    assert deepgemm.calc_diff(y.detach().double(), want.y) < 1e-9  # no output rounding left
    assert deepgemm.calc_diff(xg.grad.double(), want.dx) < 2e-5


def test_no_tokens_gives_zero_gradients() -> None:
    x = torch.zeros(0, 128, dtype=BF16, requires_grad=True)
    w = torch.randn(32, 128, requires_grad=True)
    b = torch.randn(32, requires_grad=True)
    y = deepgemm.fp8_linear(x, w, b)
    assert y.shape == (0, 32)
    y.sum().backward()
    assert x.grad.shape == (0, 128)
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))


@pytest.mark.parametrize("t,c,tokens,dtype", [(1, 1, 128, BF16), (100, 64, 128, FP32), (128, 65, 128, BF16),
                                              (300, 200, 384, FP16), (256, 7, 512, FP32)])
def test_transposed_quantizer_matches_the_padded_reference(t: int, c: int, tokens: int, dtype: torch.dtype,
                                                           seed: int) -> None:
    x = activations(t, c, dtype)
    q, sf = quantize_transposed(x, tokens)
    want_q, want_sf = quantize_per_token_group_reference(transposed_padded(x, tokens), 128)
    assert q.shape == (c, tokens) and sf.shape == (c, tokens // 128) and sf.stride()[0] == 1
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(sf, want_sf)
    assert not q[:, t:].view(torch.uint8).any()  # the padding quantizes to zeros


@pytest.mark.parametrize("t,c,tokens", [(1, 1, 128), (300, 200, 384), (128, 7, 256)])
def test_both_ways_is_the_two_quantizations(t: int, c: int, tokens: int, seed: int) -> None:
    x = activations(t, c, BF16)
    q, sf, qt, sft = quantize_both_ways(x, tokens)
    want_q, want_sf = deepgemm.quantize_per_token_group(x)
    want_qt, want_sft = quantize_transposed(x, tokens)
    for got, want in ((q, want_q), (qt, want_qt)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(sf, want_sf) and sf.stride() == want_sf.stride()
    assert torch.equal(sft, want_sft) and sft.stride() == want_sft.stride()


@pytest.mark.parametrize("n,k", [(1, 200), (300, 1), (1, 1)])
def test_block_quantizer_transpose_never_aliases(n: int, k: int, seed: int) -> None:
    """A one-row or one-column weight's q^T is contiguous as a view of q: the op returns a copy (outputs of a custom
    op may not alias each other)."""
    q, sf, qt, sft = quantize_per_block_transposed(weights(n, k, FP32))
    assert qt.shape == (k, n) and qt.is_contiguous() and sft.is_contiguous()
    assert qt.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()
    assert sft.untyped_storage().data_ptr() != sf.untyped_storage().data_ptr()
    assert torch.equal(qt.view(torch.uint8), q.t().contiguous().view(torch.uint8))


def test_block_quantizer_with_transpose(seed: int) -> None:
    w = weights(300, 200, FP32)
    q, sf, qt, sft = quantize_per_block_transposed(w)
    want_q, want_sf = deepgemm.quantize_per_block(w)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(sf, want_sf)
    assert qt.shape == (200, 300) and qt.is_contiguous() and sft.shape == (2, 3) and sft.is_contiguous()
    assert torch.equal(qt.view(torch.uint8), q.t().contiguous().view(torch.uint8))
    # Quantizing W^T per block gives the same bytes and scales: Dgrad's operand
    t_q, t_sf = deepgemm.quantize_per_block(w.t().contiguous())
    assert torch.equal(t_q.view(torch.uint8), qt.view(torch.uint8)) and torch.equal(t_sf, sft)


def test_column_major_input_gives_what_a_contiguous_copy_gives(seed: int) -> None:
    x = activations(300, 96, BF16)
    a = deepgemm.quantize_per_token_group(x.t())
    b = deepgemm.quantize_per_token_group(x.t().contiguous())
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])


def test_argument_rules() -> None:
    x, w = torch.randn(4, 128), torch.randn(32, 128)
    cases = [
        (ValueError, "in_features=120 must be a multiple of 16", lambda: deepgemm.fp8_linear(torch.randn(4, 120),
                                                                                            torch.randn(32, 120))),
        (ValueError, "out_features=40 must be a multiple of 16", lambda: deepgemm.fp8_linear(x, torch.randn(40, 128))),
        (ValueError, "'x' has 64 features", lambda: deepgemm.fp8_linear(torch.randn(4, 64), w)),
        (ValueError, "'weight' must be 2-D", lambda: deepgemm.fp8_linear(x, torch.randn(2, 32, 128))),
        (ValueError, "'bias' must have shape (32,)", lambda: deepgemm.fp8_linear(x, w, torch.randn(31))),
        (TypeError, "'weight'", lambda: deepgemm.fp8_linear(x, w.double())),
        (TypeError, "'x'", lambda: deepgemm.fp8_linear(x.to(torch.int32), w)),
        (TypeError, "'bias'", lambda: deepgemm.fp8_linear(x, w, [0.0] * 32)),
        (TypeError, "'out_dtype' must be None (x's dtype) or one of",
         lambda: deepgemm.fp8_linear(x, w, out_dtype=torch.int8)),
        (ValueError, "'tokens' must be an int >= x's 4 rows", lambda: quantize_transposed(x, 3)),
        (ValueError, "and <= 2147483647", lambda: quantize_transposed(x, 2**32)),
        (ValueError, "at most 65535 (CUDA's grid y limit)",
         lambda: quantize_per_block_transposed(torch.empty(1, 65536 * 128))),
        (ValueError, "'tokens' must be an int >= x's 4 rows", lambda: quantize_both_ways(x, True)),
        (ValueError, "in_features'=100 must be a multiple of 16", lambda: Fp8TrainingLinear(100, 32)),
        (ValueError, "out_features'=20 must be a multiple of 16",
         lambda: Fp8TrainingLinear.from_linear(nn.Linear(32, 20))),
    ]
    for error, message, call in cases:
        with pytest.raises(error, match=re.escape(message)):
            call()


def test_double_backward_is_refused(seed: int) -> None:
    x = torch.randn(8, 128, requires_grad=True)
    w = torch.randn(32, 128, requires_grad=True)
    (gx,) = torch.autograd.grad(deepgemm.fp8_linear(x, w).square().sum(), x, create_graph=True)  # dy requires grad
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gx.sum().backward()


def test_training_linear_shares_parameters_and_state_dict(seed: int) -> None:
    linear = nn.Linear(256, 128)
    layer = Fp8TrainingLinear.from_linear(linear)
    assert layer.weight is linear.weight and layer.bias is linear.bias
    assert set(layer.state_dict()) == set(linear.state_dict())
    x = activations(40, 256, FP32)
    dy = activations(40, 128, FP32)
    xg = x.clone().requires_grad_()
    layer(xg).backward(dy)
    want = quantized(x, linear.weight.detach(), linear.bias.detach(), dy)
    assert deepgemm.calc_diff(linear.weight.grad.double(), want.dw) < 2e-5
    torch.testing.assert_close(linear.bias.grad.double(), want.db, rtol=1e-5, atol=1e-4)
    fresh = Fp8TrainingLinear(256, 128, bias=False, dtype=BF16)
    assert fresh.weight.dtype == BF16 and fresh.bias is None


def test_convert_for_training_keeps_the_optimizer_working(seed: int) -> None:
    model = nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 2040), nn.Linear(2040, 16),
                          nn.Linear(16, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    report = convert(model, training=True)
    assert [layer.name for layer in report.replaced] == ["0"]
    assert str(report).startswith("converted 1 linear layer(s) to Fp8TrainingLinear, left 3")
    reasons = {layer.name: layer.reason for layer in report.left}
    assert "out_features % 16 != 0" in reasons["2"]
    assert "in_features % 16 != 0" in reasons["3"] and "too small" in reasons["4"]
    assert type(model[0]) is Fp8TrainingLinear and type(model[2]) is nn.Linear
    model(torch.randn(4, 2048)).square().sum().backward()
    optimizer.step()
    assert all(not torch.equal(p, q) for p, q in zip(model.parameters(), before))  # the optimizer saw the grads
    with pytest.raises(ValueError, match="leave dtype=None"):
        convert(nn.Sequential(nn.Linear(2048, 4096)), training=True, dtype=BF16)


def test_convert_for_training_takes_meta_weights() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4096, 2048))
    report = convert(model, training=True)
    assert len(report.replaced) == 1 and model[0].weight.is_meta
    model.to_empty(device="cpu")
    assert not model[0].weight.is_meta and model(torch.randn(2, 4096)).shape == (2, 2048)


def test_compiled_output_keeps_x_dtype_with_a_float32_bias(seed: int) -> None:
    torch._dynamo.reset()
    w, b = weights(64, 256, FP32), torch.randn(64)
    x = activations(40, 256, BF16)
    eager = deepgemm.fp8_linear(x, w, b)
    compiled = torch.compile(deepgemm.fp8_linear, fullgraph=True, backend="aot_eager")(x, w.clone().requires_grad_(), b)
    assert eager.dtype == compiled.dtype == BF16 and torch.equal(compiled.detach(), eager)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_fullgraph_forward_and_backward(dynamic: bool, seed: int) -> None:
    torch._dynamo.reset()
    layer = Fp8TrainingLinear(256, 128)

    def step(inp: torch.Tensor) -> torch.Tensor:
        return layer(inp)

    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for tokens in (64, 100, 300) if dynamic else (64,):
        x = activations(tokens, 256, FP32)
        dy = activations(tokens, 128, FP32)
        eager = train_step(x, layer.weight.detach(), layer.bias.detach(), dy)
        layer.zero_grad()
        xg = x.clone().requires_grad_()
        compiled(xg).backward(dy)
        assert torch.equal(xg.grad, eager[1])
        assert torch.equal(layer.weight.grad, eager[2]) and torch.equal(layer.bias.grad, eager[3])


def test_the_training_step_is_one_graph(seed: int) -> None:
    """On CPU tensors the whole step, bias included, traces into one graph (no break: fullgraph=True holds). The bias
    is added outside the autograd.Function, where torch 2.11 keeps every gradient (inside it, dx and dW came back
    zero: test_compiles_fullgraph_forward_and_backward failed on 2.11 before the change)."""
    torch._dynamo.reset()
    layer = Fp8TrainingLinear(256, 128)
    explained = torch._dynamo.explain(lambda inp: layer(inp) * 2)(activations(64, 256, FP32).requires_grad_())
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_precompile_plans_a_whole_training_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """precompile_model on a model trained in FP8 plans every kernel of a step: Fprop and Dgrad GEMMs, the Wgrad
    1D1D GEMM the launch path builds, and the quantizers of x (both ways), W (with W^T) and dy (rows, transposed),
    in the layer's dtypes; a layer whose output is float32 (a row-parallel shard's partial sums) gets dy's float32
    quantizers."""
    from deepgemm.api.precompile import Target, dense_kernel, unique_sources
    from deepgemm.kernels.sm90_fp8_gemm_1d1d.spec import KGroupedSpec, render_source
    from deepgemm.nn import precompile as precompile_module
    from deepgemm.nn.training import Fp8TrainingGemm

    planned: list = []

    def record(sources, **_: object) -> str:
        planned.extend(sources)
        return "recorded"

    class PartialSums(nn.Module):  # the protocol the tensor-parallel training layers implement
        def fp8_training_gemm(self) -> Fp8TrainingGemm:
            return Fp8TrainingGemm(256, 512, BF16, FP32)

    monkeypatch.setattr(precompile_module, "compile_sources", record)
    model = nn.Sequential(Fp8TrainingLinear(256, 128), Fp8TrainingLinear(256, 128), PartialSums())
    assert deepgemm.precompile_model(model, tokens=(64,), num_sms=132) == "recorded"
    entries = [source.entry for source in planned]
    assert entries.count("deepgemm_fp8_gemm_1d2d") == 4 and entries.count("deepgemm_fp8_gemm_kgrouped_1d1d") == 2
    assert render_source(KGroupedSpec.for_shape(128, 256)) in planned  # what get_kgrouped_plan(…, 128, 256) builds
    target = Target(132)
    for m, n, k, out in ((64, 128, 256, BF16), (64, 256, 128, BF16),   # Fprop, Dgrad of the bf16 layers
                         (64, 256, 512, FP32), (64, 512, 256, BF16)):  # float32 partial sums; dx in x's bf16
        assert unique_sources([dense_kernel(m, n, k, out, target)])[0] in planned, (m, n, k, out)
    labels = {source.label for source in planned}
    for label in ("quantize both_ways torch.bfloat16", "quantize_per_block torch.float32 b=128 +transposed",
                  "quantize transposed torch.bfloat16", "quantize transposed torch.float32",
                  "quantize_per_token_group torch.bfloat16 g=128", "quantize_per_token_group torch.float32 g=128",
                  "quantize_per_block torch.bfloat16 b=128 +transposed"):
        assert label in labels, (label, sorted(labels))
