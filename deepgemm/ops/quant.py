"""The one-pass FP8 quantizers as custom ops (the dequantizers are plain torch code and trace as it)."""

from __future__ import annotations

import torch

from deepgemm.api import quant as api
from deepgemm.ops.library import compiling, define
from deepgemm.utils import ceil_div

FP8 = torch.float8_e4m3fn


def _token_group_impl(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    return api.quantize_per_token_group(x, group_size)


def _token_group_outputs(m: int, k: int, group_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.empty((m, k), dtype=FP8, device=device)
    return q, api.empty_token_group_scales(m, ceil_div(k, group_size), device)


def _token_group_fake(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    api.check_quantize_input(x, "x", group_size, "group_size", api.GROUP_SIZES, "quantize_per_token_group")
    return _token_group_outputs(x.shape[0], x.shape[1], group_size, x.device)


def _silu_mul_impl(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    return api.silu_mul_quantize_per_token_group(x, group_size)


def _silu_mul_fake(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    api.check_silu_mul_input(x, group_size)
    return _token_group_outputs(x.shape[0], x.shape[1] // 2, group_size, x.device)


def _block_impl(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    return api.quantize_per_block(w, block)


def _block_fake(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    api.check_quantize_input(w, "w", block, "block", api.BLOCK_SIZES, "quantize_per_block")
    n, k = w.shape
    q = torch.empty((n, k), dtype=FP8, device=w.device)
    sf = torch.empty((ceil_div(n, block), ceil_div(k, block)), dtype=torch.float32, device=w.device)
    return q, sf


def _transposed_impl(x: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    return api.quantize_transposed(x, tokens)


def _transposed_fake(x: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    api.check_transposed_input(x, tokens, "quantize_transposed")
    return _token_group_outputs(x.shape[1], tokens, api.TRANSPOSED_GROUP, x.device)


def _both_impl(x: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return api.quantize_both_ways(x, tokens)


def _both_fake(x: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    api.check_transposed_input(x, tokens, "quantize_both_ways")
    t, c = x.shape
    return (*_token_group_outputs(t, c, api.TRANSPOSED_GROUP, x.device),
            *_token_group_outputs(c, tokens, api.TRANSPOSED_GROUP, x.device))


def _block_transposed_impl(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return api.quantize_per_block_transposed(w)


def _block_transposed_fake(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    api.check_quantize_input(w, "w", 128, "block", (128,), "quantize_per_block_transposed")
    q, sf = _block_fake(w, 128)
    qt = torch.empty((w.shape[1], w.shape[0]), dtype=FP8, device=w.device)
    return q, sf, qt, torch.empty((sf.shape[1], sf.shape[0]), dtype=torch.float32, device=w.device)


define("quantize_per_token_group(Tensor x, int group_size=128) -> (Tensor, Tensor)", _token_group_impl,
       _token_group_fake)
define("silu_mul_quantize_per_token_group(Tensor x, int group_size=128) -> (Tensor, Tensor)", _silu_mul_impl,
       _silu_mul_fake)
define("quantize_per_block(Tensor w, int block=128) -> (Tensor, Tensor)", _block_impl, _block_fake)
define("quantize_transposed(Tensor x, int tokens) -> (Tensor, Tensor)", _transposed_impl, _transposed_fake)
define("quantize_both_ways(Tensor x, int tokens) -> (Tensor, Tensor, Tensor, Tensor)", _both_impl, _both_fake)
define("quantize_per_block_transposed(Tensor w) -> (Tensor, Tensor, Tensor, Tensor)", _block_transposed_impl,
       _block_transposed_fake)


def quantize_per_token_group(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    if not compiling():
        return api.quantize_per_token_group(x, group_size)
    q, sf = torch.ops.deepgemm.quantize_per_token_group(x, group_size)
    return q, sf


def silu_mul_quantize_per_token_group(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    if not compiling():
        return api.silu_mul_quantize_per_token_group(x, group_size)
    q, sf = torch.ops.deepgemm.silu_mul_quantize_per_token_group(x, group_size)
    return q, sf


def quantize_per_block(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    if not compiling():
        return api.quantize_per_block(w, block)
    q, sf = torch.ops.deepgemm.quantize_per_block(w, block)
    return q, sf


def quantize_transposed(x: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not compiling():
        return api.quantize_transposed(x, tokens)
    q, sf = torch.ops.deepgemm.quantize_transposed(x, tokens)
    return q, sf


def quantize_both_ways(x: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not compiling():
        return api.quantize_both_ways(x, tokens)
    q, sf, qt, sft = torch.ops.deepgemm.quantize_both_ways(x, tokens)
    return q, sf, qt, sft


def quantize_per_block_transposed(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not compiling():
        return api.quantize_per_block_transposed(w)
    q, sf, qt, sft = torch.ops.deepgemm.quantize_per_block_transposed(w)
    return q, sf, qt, sft


quantize_per_token_group.__doc__ = api.quantize_per_token_group.__doc__
quantize_transposed.__doc__ = api.quantize_transposed.__doc__
quantize_both_ways.__doc__ = api.quantize_both_ways.__doc__
quantize_per_block_transposed.__doc__ = api.quantize_per_block_transposed.__doc__
quantize_per_block.__doc__ = api.quantize_per_block.__doc__
silu_mul_quantize_per_token_group.__doc__ = api.silu_mul_quantize_per_token_group.__doc__
