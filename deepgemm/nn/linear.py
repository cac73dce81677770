"""`Fp8Linear`: y = x W^T (+ bias) with W in e4m3 and 128x128 block scales, x quantized per call (1x128)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from deepgemm.api.backend import Backend, backend_for, fp8_linear_route
from deepgemm.api.linear import fp8_linear
from deepgemm.api.quant import INPUT_DTYPES, dequantize_per_block
from deepgemm.api.validation import refuse_grad, require_dtype, require_same_device
from deepgemm.ops import fp8_gemm_nt, quantize_per_block, quantize_per_token_group
from deepgemm.ops.library import compiling
from deepgemm.utils import ceil_div

FP8 = torch.float8_e4m3fn
BLOCK = 128
OUT_DTYPES = (torch.bfloat16, torch.float32)


class Fp8Linear(nn.Module):
    """A drop-in for nn.Linear holding its weight in FP8, the format of DeepSeek-V3/R1 and Qwen3-FP8 checkpoints.

    Buffers: `weight` float8_e4m3fn [out_features, in_features] and `weight_scale_inv` float32
    [ceil(out/128), ceil(in/128)] (the real weight is weight * weight_scale_inv, blockwise); `bias` (optional) in
    `dtype`. Each call quantizes x per 1x128 group with the one-pass kernel and runs the FP8 GEMM with FP32
    accumulation; the output has `dtype` (bfloat16 or float32) and the bias is added to it. Layers whose shape the
    kernel cannot take or runs slower on (`fp8_linear_route`) keep a dequantized copy of the weight and run a plain
    matmul instead: `route` says which. The module holds no gradient (an inference layer): to train in FP8, use
    Fp8TrainingLinear (or `convert(model, training=True)`).

    A call takes x [..., in_features] (float32, bfloat16 or float16) and returns [..., out_features] in `dtype`.

    Args:
        in_features / out_features: the weight's shape [out_features, in_features], positive ints.
        bias: whether the layer has a bias (zeros until loaded).
        device: where the buffers live (default torch's).
        dtype: the output and bias dtype, torch.bfloat16 (default) or torch.float32.

    Raises:
        ValueError: `in_features` or `out_features` is not a positive int; in a call, x's last dimension is not
            in_features.
        TypeError: `dtype` is not bfloat16/float32.
        In a call, on either route, what fp8_gemm_nt and quantize_per_token_group raise (e.g. TypeError for an
            input that is not float32/bfloat16/float16, deepgemm.NotDifferentiableError for an input that
            requires grad with grad mode on).

    Example::

        from deepgemm.nn import Fp8Linear

        layer = Fp8Linear.from_linear(torch.nn.Linear(7168, 2112, device="cuda", dtype=torch.bfloat16))
        with torch.inference_mode():
            y = layer(torch.randn(16, 7168, device="cuda", dtype=torch.bfloat16))   # bfloat16 [16, 2112]
        print(layer.route, layer.backend(16))                                          # "fp8", "sm90"
        empty = Fp8Linear(7168, 2112, bias=False, device="cuda")
        empty.load_fp8_weight(layer.weight, layer.weight_scale_inv)
    """

    weight: torch.Tensor
    weight_scale_inv: torch.Tensor
    weight_dequantized: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Fp8Linear: '{name}' must be a positive int, got {value!r}")
        if dtype not in OUT_DTYPES:
            raise TypeError(f"Fp8Linear: 'dtype' (the output and bias dtype) must be torch.bfloat16 or torch.float32, "
                            f"got {dtype}")
        self.in_features, self.out_features, self.out_dtype = in_features, out_features, dtype
        self.route = fp8_linear_route(out_features, in_features)
        self.register_buffer("weight", torch.zeros((out_features, in_features), dtype=FP8, device=device))
        self.register_buffer("weight_scale_inv", torch.ones(
            (ceil_div(out_features, BLOCK), ceil_div(in_features, BLOCK)), dtype=torch.float32, device=device))
        self.bias: nn.Parameter | None
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        # The routed path's weight, rebuilt whenever the FP8 weight is loaded; not saved.
        self.register_buffer("weight_dequantized", None, persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refresh())
        self.refresh()

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, dtype: torch.dtype | None = None) -> Fp8Linear:
        """Quantize `linear`'s weight per 128x128 block (on its device) into a new module; bias copied."""
        weight = linear.weight.detach()
        out_dtype = dtype if dtype is not None else (weight.dtype if weight.dtype in OUT_DTYPES else torch.bfloat16)
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, device=weight.device,
                     dtype=out_dtype)
        with torch.no_grad():
            q, sf = quantize_per_block(weight, BLOCK)
            module.load_fp8_weight(q, sf)
            if linear.bias is not None and module.bias is not None:
                module.bias.copy_(linear.bias.detach())
        return module

    @torch.no_grad()
    def load_fp8_weight(self, weight: torch.Tensor, scale_inv: torch.Tensor) -> None:
        """Copy an e4m3 weight [out, in] and its block scales [ceil(out/128), ceil(in/128)] (any float dtype,
        converted to float32 once here) into the buffers."""
        expected = (self.out_features, self.in_features)
        if not isinstance(weight, torch.Tensor) or weight.dtype != FP8 or tuple(weight.shape) != expected:
            got = f"{weight.dtype} {tuple(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ValueError(f"Fp8Linear.load_fp8_weight: 'weight' must be float8_e4m3fn {expected}, got {got}")
        if self.weight.is_meta:
            raise ValueError("Fp8Linear.load_fp8_weight: the module is on the meta device, where copies are no-ops; "
                             "create it on a real device (or call module.to_empty(device=...)) first")
        scales = tuple(self.weight_scale_inv.shape)
        if not isinstance(scale_inv, torch.Tensor) or not scale_inv.is_floating_point() or \
                tuple(scale_inv.shape) != scales:
            got = f"{scale_inv.dtype} {tuple(scale_inv.shape)}" if isinstance(scale_inv, torch.Tensor) \
                else type(scale_inv).__name__
            raise ValueError(f"Fp8Linear.load_fp8_weight: 'scale_inv' must be a float tensor {scales} (one scale "
                             f"per 128x128 block), got {got}")
        if not bool(torch.isfinite(scale_inv).all()):  # (one host read per layer, at load time)
            raise ValueError("Fp8Linear.load_fp8_weight: 'scale_inv' holds a NaN or infinite block scale: every "
                             "output that block feeds would be non-finite")
        self.weight.copy_(weight)
        self.weight_scale_inv.copy_(scale_inv.to(torch.float32))
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Rebuild what derives from the FP8 weight (the routed path's dequantized copy); loading does it, call it
        after writing `weight` or `weight_scale_inv` in place yourself."""
        if self.route == "bf16":
            self.weight_dequantized = dequantize_per_block(self.weight, self.weight_scale_inv, BLOCK,
                                                           torch.float32).to(self.out_dtype)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Fp8Linear:
        """Module-wide casts (`.to(dtype)`, `.half()`, `.float()`) move this layer's tensors but keep their dtypes: the
        weight stays e4m3 with float32 scales (a cast would lose them), the bias and routed weight stay `dtype`."""
        def move_only(t: torch.Tensor) -> torch.Tensor:
            moved = fn(t)
            return moved if moved.dtype == t.dtype else t.to(device=moved.device)
        super()._apply(move_only, recurse)
        return self

    def backend(self, tokens: int = 1) -> Backend:
        """Which path a call with `tokens` rows takes: "sm90" (our kernels), "reference" (CPU / non-Hopper) or
        "bf16" (routed: a plain matmul of the dequantized weight)."""
        return backend_for(self.weight, shape=(tokens, self.out_features, self.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            got = f"{x.shape[-1]} features in its last dimension" if x.dim() else "no dimensions"
            raise ValueError(f"Fp8Linear: input has {got}, expected {self.in_features} features")
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        # The state straight from the module's tables (nn.Module's attribute fallback costs ~1 us a name).
        buffers, params = self._buffers, self._parameters
        bias = params["bias"] if "bias" in params else self.bias
        if self.route == "bf16":
            weight = self.weight_dequantized
            assert weight is not None, "refresh() builds it with the weight"
            if (x.dtype not in INPUT_DTYPES or x.device != weight.device
                    or (x.requires_grad and torch.is_grad_enabled())):
                _refuse_routed_input(x, weight)
            y = F.linear(rows.to(self.out_dtype), weight, bias)
        else:
            weight, scale_inv = buffers.get("weight"), buffers.get("weight_scale_inv")
            if weight is None or scale_inv is None:  # reassigned as another kind of attribute
                weight, scale_inv = self.weight, self.weight_scale_inv
            if compiling():  # the custom ops, so the graph holds them
                y = fp8_gemm_nt(quantize_per_token_group(rows, BLOCK), (weight, scale_inv), out_dtype=self.out_dtype)
            else:  # the same two kernels through one launch-ready path (host time)
                y = fp8_linear(rows, weight, scale_inv, self.out_dtype)
            if bias is not None:
                y = y.add_(bias)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={self.out_dtype}, route={self.route}")


def _refuse_routed_input(x: torch.Tensor, weight: torch.Tensor) -> None:
    """The errors the FP8 route's quantizer and GEMM raise for the same input, on the routed (BF16 matmul) path."""
    require_dtype(x, "x", "Fp8Linear", INPUT_DTYPES)
    require_same_device("Fp8Linear", x=x, weight=weight)
    refuse_grad("Fp8Linear", x=x)
