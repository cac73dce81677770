"""deepgemm.nn on CPU: Fp8Linear against a float64 reference, state_dict, routing, convert(), torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn

import deepgemm
from deepgemm.api.backend import fp8_linear_route
from deepgemm.nn import Fp8Linear, convert

pytestmark = pytest.mark.usefixtures("small_fp8_route")  # small layers take the FP8 path


def _reference(layer: Fp8Linear, x: torch.Tensor) -> torch.Tensor:
    """float64 (quantized x) @ (dequantized W)^T + bias: what the FP8 path computes before output rounding."""
    rows = x.reshape(-1, layer.in_features)
    q, sf = deepgemm.quantize_per_token_group(rows)
    xd = deepgemm.dequantize_per_token_group(q, sf, dtype=torch.float64)
    wd = deepgemm.dequantize_per_block(layer.weight, layer.weight_scale_inv, dtype=torch.float64)
    y = xd @ wd.t()
    if layer.bias is not None:
        y = y + layer.bias.double()
    return y.reshape(*x.shape[:-1], layer.out_features)


@pytest.mark.parametrize("n,k,bias,dtype", [(600, 512, True, torch.bfloat16), (1024, 768, False, torch.float32),
                                            (520, 1152, True, torch.float32)])
def test_fp8_linear_matches_float64_reference(n: int, k: int, bias: bool, dtype: torch.dtype, seed: int) -> None:
    linear = nn.Linear(k, n, bias=bias, dtype=torch.bfloat16)
    layer = Fp8Linear.from_linear(linear, dtype=dtype)
    assert layer.route == "fp8" and layer.backend(4) == "reference"
    x = (torch.randn(2, 3, k) * torch.exp(torch.randn(2, 3, 1))).to(torch.bfloat16)
    with torch.no_grad():
        y = layer(x)
        original = linear(x).double()
    assert y.shape == (2, 3, n) and y.dtype == dtype
    assert deepgemm.calc_diff(y.double(), _reference(layer, x)) < 1e-5
    assert deepgemm.calc_diff(y.double(), original) < 2e-3  # FP8 quantization error only


def test_routed_layer_runs_the_dequantized_weight(seed: int) -> None:
    linear = nn.Linear(100, 256, dtype=torch.bfloat16)  # K % 16 != 0: the kernel cannot take it
    layer = Fp8Linear.from_linear(linear)
    assert layer.route == fp8_linear_route(256, 100) == "bf16" and layer.backend(1) == "bf16"
    x = torch.randn(7, 100).to(torch.bfloat16)
    with torch.no_grad():
        y = layer(x)
    weight = deepgemm.dequantize_per_block(layer.weight, layer.weight_scale_inv).to(torch.bfloat16)
    assert torch.equal(y, nn.functional.linear(x, weight, layer.bias))


def test_state_dict_round_trip_and_derived_state(seed: int) -> None:
    for k in (512, 100):
        source = Fp8Linear.from_linear(nn.Linear(k, 300, dtype=torch.bfloat16))
        state = source.state_dict()
        assert set(state) == {"weight", "weight_scale_inv", "bias"}
        assert state["weight"].dtype == torch.float8_e4m3fn and state["weight_scale_inv"].shape == (3, -(-k // 128))
        target = Fp8Linear(k, 300)
        target.load_state_dict(state)
        assert torch.equal(target.weight.view(torch.uint8), source.weight.view(torch.uint8))
        x = torch.randn(5, k).to(torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(target(x), source(x))


def test_load_fp8_weight_checks_and_converts_scales(seed: int) -> None:
    layer = Fp8Linear(256, 200, bias=False)
    q, sf = deepgemm.quantize_per_block(torch.randn(200, 256))
    layer.load_fp8_weight(q, sf.to(torch.bfloat16))
    assert layer.weight_scale_inv.dtype == torch.float32
    with pytest.raises(ValueError, match="'weight' must be float8_e4m3fn"):
        layer.load_fp8_weight(q.float(), sf)
    with pytest.raises(ValueError, match="'scale_inv' must be a float tensor"):
        layer.load_fp8_weight(q, sf[:1])


def test_constructor_and_forward_errors() -> None:
    with pytest.raises(ValueError, match="'in_features'"):
        Fp8Linear(0, 8)
    with pytest.raises(TypeError, match="'dtype'"):
        Fp8Linear(128, 128, dtype=torch.float16)
    layer = Fp8Linear(1024, 512)
    with pytest.raises(ValueError, match="expected 1024"):
        layer(torch.randn(2, 512))
    with pytest.raises(deepgemm.NotDifferentiableError):
        layer(torch.randn(2, 1024, requires_grad=True))
    with pytest.raises(ValueError, match="no dimensions"):
        layer(torch.tensor(1.0))


@pytest.mark.parametrize("in_features", [1024, 100])  # 100: in_features % 16 != 0 routes to a BF16 matmul
def test_both_routes_refuse_the_same_inputs(in_features: int) -> None:
    """The routed path cast any input to the layer's dtype and recorded a graph for one that requires grad; it now
    raises what the FP8 path's quantizer raises."""
    layer = Fp8Linear(in_features, 512)
    assert layer.route == ("fp8" if in_features == 1024 else "bf16")
    for dtype in (torch.int32, torch.float64):
        with pytest.raises(TypeError, match="'x' must have dtype"):
            layer(torch.ones(2, in_features, dtype=dtype))
    with pytest.raises(deepgemm.NotDifferentiableError):
        layer(torch.randn(2, in_features, requires_grad=True))
    with pytest.raises(ValueError, match="share a device"):
        layer(torch.randn(2, in_features, device="meta"))
    with torch.no_grad():
        assert layer(torch.randn(2, in_features, requires_grad=True)).shape == (2, 512)
    assert layer(torch.randn(3, in_features, dtype=torch.float16)).dtype == torch.bfloat16


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(512, 1536, dtype=torch.bfloat16)
        self.attn = nn.MultiheadAttention(512, 4, dtype=torch.bfloat16)
        self.odd = nn.Linear(100, 512, dtype=torch.bfloat16)
        self.tiny = nn.Linear(64, 64, dtype=torch.bfloat16)
        self.mlp = nn.Sequential(nn.Linear(512, 2048, dtype=torch.bfloat16), nn.GELU(),
                                 nn.Linear(2048, 512, dtype=torch.bfloat16))
        self.lm_head = nn.Linear(512, 1000, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
        h = self.qkv(x)[..., :512] + self.odd(side)
        return self.lm_head(self.mlp(h))


def test_convert_replaces_what_fp8_serves_and_explains_the_rest(seed: int) -> None:
    model = _Block()
    x, side = torch.randn(6, 512).to(torch.bfloat16), torch.randn(6, 100).to(torch.bfloat16)
    with torch.no_grad():
        before = model(x, side).double()
    report = convert(model, exclude=["lm_head"])
    assert [layer.name for layer in report.replaced] == ["qkv", "mlp.0", "mlp.2"]
    left = {layer.name: layer.reason for layer in report.left}
    assert set(left) == {"attn.out_proj", "odd", "tiny", "lm_head"}
    assert "exclude" in left["lm_head"] and "% 16" in left["odd"] and "small" in left["tiny"]
    assert "MultiheadAttention" in left["attn.out_proj"] or "subclasses" in left["attn.out_proj"]
    assert isinstance(model.qkv, Fp8Linear) and isinstance(model.mlp[2], Fp8Linear)
    assert type(model.odd) is nn.Linear and type(model.lm_head) is nn.Linear
    with torch.no_grad():
        after = model(x, side).double()
    assert deepgemm.calc_diff(after, before) < 5e-3
    assert "converted 3 linear layer(s)" in str(report)

    only = _Block()
    report = convert(only, include=lambda name, module: name.startswith("mlp"))
    assert [layer.name for layer in report.replaced] == ["mlp.0", "mlp.2"]
    with pytest.raises(TypeError, match="'dtype'"):
        convert(_Block(), dtype=torch.float16)


def test_convert_leaves_float64_layers_and_is_all_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float64 layer is left with its reason (it used to reach the quantizer, which raised TypeError after the
    layers before it had been replaced); an error while quantizing leaves every layer as it was."""
    model = nn.Sequential(nn.Linear(4096, 2048, dtype=torch.bfloat16), nn.Linear(2048, 4096, dtype=torch.float64))
    report = convert(model)
    assert [layer.name for layer in report.replaced] == ["0"]
    assert [(layer.name, "float64" in layer.reason) for layer in report.left] == [("1", True)]
    assert isinstance(model[0], Fp8Linear) and type(model[1]) is nn.Linear

    model = nn.Sequential(nn.Linear(4096, 2048, dtype=torch.bfloat16), nn.Linear(2048, 4096, dtype=torch.bfloat16))
    real = Fp8Linear.from_linear

    def fail_on_second(module: nn.Linear, **kwargs: object) -> Fp8Linear:
        if module is model[1]:
            raise deepgemm.CompileError("quantizer failed")
        return real(module, **kwargs)

    monkeypatch.setattr(Fp8Linear, "from_linear", fail_on_second)
    with pytest.raises(deepgemm.CompileError):
        convert(model)
    assert type(model[0]) is nn.Linear and type(model[1]) is nn.Linear


def test_converted_model_compiles_fullgraph_with_dynamic_tokens(seed: int) -> None:
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(512, 1024, dtype=torch.bfloat16), nn.SiLU(),
                          nn.Linear(1024, 512, dtype=torch.bfloat16))
    convert(model)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, _inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=backend)
    with torch.inference_mode():
        for tokens in (9, 130, 513):
            x = torch.randn(tokens, 512).to(torch.bfloat16)
            assert torch.equal(compiled(x), model(x))
    assert len(graphs) == 1
    targets = [str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert sum("deepgemm.fp8_gemm_nt" in t for t in targets) == 2
    assert sum("deepgemm.quantize_per_token_group" in t for t in targets) == 2


def test_module_casts_move_but_keep_the_fp8_format(seed: int) -> None:
    model = nn.Sequential(Fp8Linear.from_linear(nn.Linear(512, 768, dtype=torch.bfloat16)),
                          nn.LayerNorm(768, dtype=torch.bfloat16))
    layer = model[0]
    scales = layer.weight_scale_inv.clone()
    model.to(torch.float16)
    assert layer.weight.dtype == torch.float8_e4m3fn and torch.equal(layer.weight_scale_inv, scales)
    assert layer.bias.dtype == torch.bfloat16 and model[1].weight.dtype == torch.float16
    model.float()
    assert layer.weight_scale_inv.dtype == torch.float32 and layer.out_dtype == torch.bfloat16
    meta = Fp8Linear(512, 768, device="meta")
    with pytest.raises(ValueError, match="meta device"):
        meta.load_fp8_weight(layer.weight, layer.weight_scale_inv)


def test_non_finite_block_scales_are_refused() -> None:
    """A NaN or infinite scale loaded without a word and made every output of its block non-finite."""
    layer = Fp8Linear(256, 256, bias=False)
    weight = torch.ones(256, 256).to(torch.float8_e4m3fn)
    for bad in (float("nan"), float("inf")):
        scales = torch.ones(2, 2)
        scales[1, 0] = bad
        with pytest.raises(ValueError, match="NaN or infinite block scale"):
            layer.load_fp8_weight(weight, scales)
    layer.load_fp8_weight(weight, torch.ones(2, 2))

