"""Float64 expectations for deepgemm.fp8_linear (FP8 training), shared by the CPU and GPU tests.

The quantized operands come from deepgemm.reference's quantizers (the yardstick the GPU quantizers match bit for
bit); every product is then taken in float64, so the only differences left to a correct implementation are its FP32
accumulation and the output's rounding. `unquantized` gives the plain float64 linear layer, which FP8 matches to
calc_diff ~1e-3."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import deepgemm
from deepgemm.reference import quantize_per_block_reference, quantize_per_token_group_reference
from deepgemm.utils import align_up, ceil_div

F64 = torch.float64


@dataclass
class LinearGrads:
    y: torch.Tensor
    dx: torch.Tensor
    dw: torch.Tensor
    db: torch.Tensor


def _groups(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] quantized per 1x128 group (on the CPU: the bit-exact yardstick) and dequantized, float64, on x's
    device."""
    q, sf = quantize_per_token_group_reference(x.float().cpu(), 128)
    k = x.shape[1]
    return (q.to(F64) * sf.to(F64).repeat_interleave(128, dim=1)[:, :k]).to(x.device)


def _blocks(w: torch.Tensor) -> torch.Tensor:
    q, sf = quantize_per_block_reference(w.float().cpu(), 128)
    n, k = w.shape
    scale = sf.to(F64).repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:n, :k]
    return (q.to(F64) * scale).to(w.device)


def transposed_padded(x: torch.Tensor, tokens: int) -> torch.Tensor:
    """x^T [C, tokens] in float32, zeros past x's T rows: what the transposed quantizer quantizes."""
    padded = torch.zeros((x.shape[1], tokens), dtype=torch.float32, device=x.device)
    padded[:, : x.shape[0]] = x.t().float()
    return padded


def quantized(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, dy: torch.Tensor) -> LinearGrads:
    """y, dx, dW, db of fp8_linear's quantized math in float64 (x [T, K], w [N, K], dy [T, N], on their device)."""
    x_q, w_q = _groups(x), _blocks(w)
    y = x_q @ w_q.t()
    if b is not None:
        y = y + b.to(F64)
    dx = _groups(dy) @ w_q
    tokens = align_up(x.shape[0], 128)
    dw = _groups(transposed_padded(dy, tokens)) @ _groups(transposed_padded(x, tokens)).t()
    return LinearGrads(y, dx, dw, dy.to(F64).sum(0))


def unquantized(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, dy: torch.Tensor) -> LinearGrads:
    x, w, dy = x.to(F64), w.to(F64), dy.to(F64)
    y = x @ w.t() + (0 if b is None else b.to(F64))
    return LinearGrads(y, dy @ w, dy.t() @ x, dy.sum(0))


def train_step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, dy: torch.Tensor):
    """(y, dx, dW, db) of deepgemm.fp8_linear on fresh leaf copies of x, w, b, with dy as the output gradient."""
    x = x.clone().requires_grad_()
    w = w.clone().requires_grad_()
    b = None if b is None else b.clone().requires_grad_()
    y = deepgemm.fp8_linear(x, w, b)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, None if b is None else b.grad


def activations(t: int, k: int, dtype: torch.dtype, device: str | torch.device = "cpu") -> torch.Tensor:
    """Activation-like rows with per-row magnitudes spread over e^N(0, 1) (so per-group scales matter)."""
    x = torch.randn(t, k, dtype=F64) * torch.exp(torch.randn(t, 1, dtype=F64))
    return x.to(device=device, dtype=dtype)


def weights(n: int, k: int, dtype: torch.dtype, device: str | torch.device = "cpu") -> torch.Tensor:
    w = torch.randn(n, k, dtype=F64) * 0.05 * torch.exp(torch.randn(n, 1, dtype=F64) * 0.5)
    return w.to(device=device, dtype=dtype)


def scale_groups(tokens: int) -> int:
    return ceil_div(tokens, 128)
