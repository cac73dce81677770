"""FP8 quantization in the layouts the GEMM reads, and the matching dequantization."""

from __future__ import annotations

from collections.abc import Callable

import torch

from deepgemm.api.backend import backend_for
from deepgemm.api.ready_launches import keep
from deepgemm.kernels.common.grid import MAX_GRID_X, MAX_GRID_Y
from deepgemm.kernels.common.layout import tma_aligned_rows
from deepgemm.api.validation import (
    MAX_ROWS,
    refuse_grad,
    require_dtype,
    require_int,
    require_rank,
    require_same_device,
    require_tensor,
)
from deepgemm.kernels.quantize_fp8.launch import (
    TRANSPOSED_GROUP,
    quantize_per_block_cuda,
    quantize_per_token_group_cuda,
    quantize_transposed_cuda,
)
from deepgemm.reference import (
    dequantize_per_block as _dequantize_per_block,
    dequantize_per_token_group as _dequantize_per_token_group,
    quantize_per_block_reference,
    quantize_per_token_group_reference,
    silu_mul_reference,
)
from deepgemm.utils import ceil_div

INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
GROUP_SIZES = tuple(range(32, 1025, 32))
BLOCK_SIZES = (32, 64, 128)
DEQUANTIZE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_TOKEN_GROUP_WARPS_PER_CTA = 8  # the per-token-group kernel's 256-thread CTAs: at worst one group per warp
MAX_TRANSPOSED_COLUMNS = 64 * MAX_GRID_Y  # the transposed quantizer's grid: 64 columns of x per CTA along y


# Inputs of the per-token-group quantizers that passed validation and took a kernel path without a copy, by
# (shape, strides, dtype, device index, group size, silu_mul) -> the launcher: a warm call with the same metadata
# goes straight to the kernel (the checks, the stride test and the backend lookup cost ~2 us of Python per call).
_Launcher = Callable[[torch.Tensor, int, bool], tuple[torch.Tensor, torch.Tensor]]
_kernel_ready: dict[tuple, _Launcher] = {}
_grad_enabled = torch.is_grad_enabled


def _kernel_ready_key(x: object, group_size: object, silu_mul: bool) -> tuple | None:
    """The warm-path key of a call, or None where the checked path must run (a tensor subclass, a group size that is
    not a plain int)."""
    if type(x) is not torch.Tensor or type(group_size) is not int:
        return None
    return (x.shape, x.stride(), x.dtype, x.get_device(), group_size, silu_mul)


def _remember_kernel_ready(key: tuple | None, launcher: _Launcher) -> None:
    if key is not None:
        keep(_kernel_ready, key, launcher)


def _rows_kernel(x: torch.Tensor, group_size: int, silu_mul: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_per_token_group_cuda(x, group_size, silu_mul=silu_mul)


def _columns_kernel(x: torch.Tensor, group_size: int, silu_mul: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A column-major x [M, K] (x.t() row-major, e.g. dY.t() for a Wgrad operand): the transposed kernel reads
    x.t() in place instead of a contiguous copy being made first."""
    qt, sft = quantize_transposed_cuda(x.t(), x.shape[1])
    return qt, sft


def _column_major(x: torch.Tensor, group_size: int, silu_mul: bool) -> bool:
    """x is a transposed row-major tensor the transposed kernel reads in place (groups of 128, no activation)."""
    return (not silu_mul and group_size == TRANSPOSED_GROUP and x.shape[1] > 1 and x.stride(0) == 1
            and x.stride(1) != 1 and x.shape[0] <= MAX_TRANSPOSED_COLUMNS)


def empty_token_group_scales(m: int, groups: int, device: torch.device) -> torch.Tensor:
    """[M, G] float32 scales as an M-major view with strides (1, align(M, 4)): the layout both paths return."""
    storage = torch.zeros((groups, tma_aligned_rows(m)), dtype=torch.float32, device=device)
    return storage[:, :m].t()


def _as_mn_major(sf: torch.Tensor) -> torch.Tensor:
    """Row-major [M, G] scales -> the same values in the M-major layout."""
    out = empty_token_group_scales(sf.shape[0], sf.shape[1], sf.device)
    out.copy_(sf)
    return out


def _unit_column_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.shape[1] <= 1 or x.stride(1) == 1 else x.contiguous()


def check_quantize_input(x: object, name: str, group: object, group_name: str, groups: tuple[int, ...],
                         where: str) -> torch.Tensor:
    """The quantizers' metadata rules (shared with the custom ops' fake kernels)."""
    tensor = require_tensor(x, name, where)
    require_dtype(tensor, name, where, INPUT_DTYPES)
    require_rank(tensor, name, where, 2)
    group_size = require_int(group, group_name, where, groups)
    _require_quantizable_size(tensor, name, group_size, where)
    refuse_grad(where, **{name: tensor})
    return tensor


def _require_quantizable_size(x: torch.Tensor, name: str, group: int, where: str) -> None:
    """Sizes the GPU kernels index and launch without wrapping (32-bit row/column counts, CUDA grid limits), on
    every path so a CPU-tested call never fails only on the GPU."""
    rows, cols = x.shape
    for what, size in (("rows", rows), ("columns", cols)):
        if size > MAX_ROWS:
            raise ValueError(f"{where}: '{name}' has {size} {what}, past the quantizers' 32-bit index limit "
                             f"({MAX_ROWS})")
    if where.startswith("quantize_per_block"):  # (also quantize_per_block_transposed: the same grid)
        k_blocks = ceil_div(cols, group)
        if k_blocks > MAX_GRID_Y:
            raise ValueError(f"{where}: '{name}' has {cols} columns = {k_blocks} blocks of {group}; the kernel's grid "
                             f"takes at most {MAX_GRID_Y} (CUDA's grid y limit): use a larger 'block' or split K")
    else:
        ctas = ceil_div(rows * ceil_div(cols, group), _TOKEN_GROUP_WARPS_PER_CTA)
        if ctas > MAX_GRID_X:
            raise ValueError(f"{where}: '{name}' is [{rows}, {cols}]: {rows} x ceil({cols}/{group}) groups need "
                             f"{ctas} CTAs, past CUDA's grid limit ({MAX_GRID_X}); use a larger 'group_size' or "
                             "split the rows")


def quantize_per_token_group(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32/bfloat16/float16 -> (q e4m3 [M, K], sf float32 [M, ceil(K/group_size)]).

    sf[m, g] = max(amax(x[m, g*G:(g+1)*G]) / 448, FLT_MIN) and q = x / sf rounded to e4m3. sf is an
    M-major view (strides (1, align(M, 4))): exactly what fp8_gemm_nt reads, with no copy. One pass on an sm_90
    GPU; elsewhere the reference path gives bit-identical results.

    Args:
        x: float32, bfloat16 or float16 [M, K], any strides: a transposed view (unit stride along M, e.g. dY.t())
            with group_size 128 is read in place by a transposing kernel, another non-unit column stride is copied
            first.
        group_size: columns per scale, a multiple of 32 from 32 to 1024; the GEMMs read 128.

    Raises:
        TypeError: `x` is not a tensor or has another dtype.
        ValueError: `x` is not 2-D, `group_size` is not allowed, or `x` is too large for the kernel's 32-bit
            indices and CUDA's grid (checked on every path).
        deepgemm.NotDifferentiableError: `x` requires grad while grad mode is on.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError, deepgemm.GraphCaptureError: as for
            fp8_gemm_nt, on the first GPU call of an input dtype and group size.

    Example::

        x = torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16)
        q, sf = deepgemm.quantize_per_token_group(x)       # e4m3 [4096, 7168], float32 [4096, 56]
        assert sf.stride() == (1, 4096)                    # M-major
    """
    return _token_group(x, group_size, False)


def _token_group(x: torch.Tensor, group_size: int, silu_mul: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Both per-token-group quantizers: a warm input (its metadata passed the checks on the kernel path before) goes
    straight to the kernel; otherwise the checks, then the kernel or the reference path."""
    key = _kernel_ready_key(x, group_size, silu_mul)
    launcher = _kernel_ready.get(key) if key is not None else None
    if launcher is not None and not (_grad_enabled() and x.requires_grad):
        return launcher(x, group_size, silu_mul)
    if silu_mul:
        checked = check_silu_mul_input(x, group_size)
    else:
        checked = check_quantize_input(x, "x", group_size, "group_size", GROUP_SIZES, "quantize_per_token_group")
    if backend_for(checked) == "sm90" and _column_major(checked, group_size, silu_mul):
        _remember_kernel_ready(key, _columns_kernel)
        return _columns_kernel(checked, group_size, silu_mul)
    x = _unit_column_stride(checked)
    if backend_for(x) == "sm90":
        if x is checked:
            _remember_kernel_ready(key, _rows_kernel)
        return _rows_kernel(x, group_size, silu_mul)
    q, sf = quantize_per_token_group_reference(silu_mul_reference(x) if silu_mul else x, group_size)
    return q, _as_mn_major(sf)


def check_transposed_input(x: object, tokens: object, where: str) -> torch.Tensor:
    """The transposing quantizers' rules (shared with their fake kernels): x as for quantize_per_token_group, and
    `tokens` an int >= x's rows (the padded token count)."""
    checked = check_quantize_input(x, "x", TRANSPOSED_GROUP, "group_size", (TRANSPOSED_GROUP,), where)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not checked.shape[0] <= tokens <= MAX_ROWS:
        raise ValueError(f"{where}: 'tokens' must be an int >= x's {checked.shape[0]} rows and <= {MAX_ROWS} (the "
                         f"kernel's 32-bit token index), got {tokens!r}")
    return checked


def _transposed_reference(x: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    t, c = x.shape
    padded = torch.zeros((c, tokens), dtype=torch.float32, device=x.device)
    padded[:, :t] = x.t()
    if backend_for(x) == "sm90":  # (more columns than the transposed kernel's grid takes)
        return quantize_per_token_group_cuda(padded, TRANSPOSED_GROUP)
    q, sf = quantize_per_token_group_reference(padded, TRANSPOSED_GROUP)
    return q, _as_mn_major(sf)


def quantize_transposed(x: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, C] -> quantize_per_token_group of x^T zero-padded to `tokens` (>= T) columns: (qt e4m3 [C, tokens],
    sft float32 [C, ceil(tokens/128)] M-major), in one pass on an sm_90 GPU (no transposed or padded copy): a Wgrad
    operand (the 1D1D GEMM takes whole 128-token blocks)."""
    checked = check_transposed_input(x, tokens, "quantize_transposed")
    if backend_for(checked) == "sm90" and checked.shape[1] <= MAX_TRANSPOSED_COLUMNS:
        qt, sft = quantize_transposed_cuda(_unit_column_stride(checked), tokens)
        return qt, sft
    return _transposed_reference(checked, tokens)


def quantize_both_ways(x: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, C] -> quantize_per_token_group(x) + quantize_transposed(x, tokens) from one read of x: (q [T, C], sf
    [T, ceil(C/128)] M-major, qt [C, tokens], sft [C, ceil(tokens/128)] M-major), an FP8 training step's two
    quantizations of an activation or a gradient (Fprop/Dgrad along C, Wgrad along the tokens)."""
    checked = check_transposed_input(x, tokens, "quantize_both_ways")
    if backend_for(checked) == "sm90" and checked.shape[1] <= MAX_TRANSPOSED_COLUMNS:
        q, sf, qt, sft = quantize_transposed_cuda(_unit_column_stride(checked), tokens, rows_too=True)
        return q, sf, qt, sft
    q, sf = _token_group(checked, TRANSPOSED_GROUP, False)
    qt, sft = _transposed_reference(checked, tokens)
    return q, sf, qt, sft


def quantize_per_block_transposed(w: torch.Tensor
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """quantize_per_block(w, 128) plus qt = q^T (contiguous e4m3 [K, N]) and sft = sf^T (row-major
    [ceil(K/128), ceil(N/128)]) written by the same pass: the FP8 training linear's weight for Fprop (q, sf) and
    Dgrad (qt, sft), bit-identical to quantize_per_block(w.t())."""
    w = check_quantize_input(w, "w", 128, "block", (128,), "quantize_per_block_transposed")
    w = _unit_column_stride(w)
    if backend_for(w) == "sm90":
        q, sf, qt, sft = quantize_per_block_cuda(w, 128, transposed=True)
        return q, sf, qt, sft
    q, sf = quantize_per_block_reference(w, 128)
    copy = torch.contiguous_format  # (a clone: .contiguous() of a [1, K] transpose would alias q)
    return q, sf, q.t().clone(memory_format=copy), sf.t().clone(memory_format=copy)


def check_silu_mul_input(x: object, group_size: object) -> torch.Tensor:
    """silu_mul_quantize_per_token_group's metadata rules (shared with its fake kernel)."""
    where = "silu_mul_quantize_per_token_group"
    tensor = check_quantize_input(x, "x", group_size, "group_size", GROUP_SIZES, where)
    if tensor.shape[1] % 2:
        raise ValueError(f"{where}: 'x' must hold [gate | up] halves of equal width, got {tensor.shape[1]} columns "
                         "(an odd count)")
    return tensor


def silu_mul_quantize_per_token_group(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, 2I] = [gate | up] -> quantize_per_token_group(silu(gate) * up): (q e4m3 [M, I], sf float32
    [M, ceil(I/group_size)] M-major), the gated MLP activation fused into the quantizer that feeds the down
    projection.

    The activation is computed in float32 from x's values (no rounding to x's dtype in between) and never written
    to memory: one pass reads x and writes q and sf. gate is x[:, :I], up is x[:, I:], as a fused gate_up
    projection's output holds them. On CPU tensors and other GPUs the reference path computes the same formula;
    its exp may differ from the GPU's in the last bit, so the two agree to within one e4m3 rounding step.

    Args:
        x: float32, bfloat16 or float16 [M, 2I], any strides (a non-unit column stride is copied first).
        group_size: columns of the activation per scale, a multiple of 32 from 32 to 1024; the GEMMs read 128.

    Raises:
        TypeError: `x` is not a tensor or has another dtype.
        ValueError: `x` is not 2-D or has an odd column count, `group_size` is not allowed, or `x` is too large for
            the kernel's 32-bit indices and CUDA's grid.
        deepgemm.NotDifferentiableError: `x` requires grad while grad mode is on.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError, deepgemm.GraphCaptureError: as for
            quantize_per_token_group.

    Example::

        gate_up = torch.randn(4096, 2 * 768, device="cuda", dtype=torch.bfloat16)  # an MoE gate_up output
        q, sf = deepgemm.silu_mul_quantize_per_token_group(gate_up)             # e4m3 [4096, 768], [4096, 6]
    """
    return _token_group(x, group_size, True)


def quantize_per_block(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float32/bfloat16/float16 -> (q e4m3 [N, K], sf float32 [ceil(N/b), ceil(K/b)] row-major).

    One scale per block x block tile, sf = max(amax(tile) / 448, FLT_MIN), q = w / sf rounded to e4m3; the layout
    fp8_gemm_nt reads for B (block=128). One pass on an sm_90 GPU; elsewhere the reference path gives
    bit-identical results.

    Args:
        w: float32, bfloat16 or float16 [N, K], any strides (a non-unit column stride is copied first).
        block: the tile edge, 32, 64 or 128; the GEMMs read 128.

    Raises:
        TypeError: `w` is not a tensor or has another dtype.
        ValueError: `w` is not 2-D, `block` is not allowed, or `w` is too large for the kernel (32-bit indices,
            at most 65535 blocks along K; checked on every path).
        deepgemm.NotDifferentiableError: `w` requires grad while grad mode is on.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError, deepgemm.GraphCaptureError: as for
            fp8_gemm_nt, on the first GPU call of an input dtype and block.

    Example::

        w = torch.randn(2112, 7168, device="cuda", dtype=torch.bfloat16)
        q, sf = deepgemm.quantize_per_block(w)              # e4m3 [2112, 7168], float32 [17, 56]
    """
    w = check_quantize_input(w, "w", block, "block", BLOCK_SIZES, "quantize_per_block")
    w = _unit_column_stride(w)
    if backend_for(w) == "sm90":
        q, sf = quantize_per_block_cuda(w, block)
        return q, sf
    return quantize_per_block_reference(w, block)


def _require_quantized(q: torch.Tensor, sf: torch.Tensor, where: str, expected_sf: tuple[int, int], rule: str,
                       dtype: object) -> None:
    require_tensor(q, "q", where)
    require_tensor(sf, "sf", where)
    require_dtype(q, "q", where, (torch.float8_e4m3fn,))
    require_rank(q, "q", where, 2)
    require_dtype(sf, "sf", where, (torch.float32,))
    if tuple(sf.shape) != expected_sf:
        raise ValueError(f"{where}: 'sf' must have shape {expected_sf} ({rule}), got {tuple(sf.shape)}")
    require_same_device(where, q=q, sf=sf)
    if not isinstance(dtype, torch.dtype) or dtype not in DEQUANTIZE_DTYPES:
        names = ", ".join(str(d) for d in DEQUANTIZE_DTYPES)
        raise TypeError(f"{where}: 'dtype' must be one of {names}, got {dtype!r}")


def dequantize_per_token_group(q: torch.Tensor, sf: torch.Tensor, group_size: int = 128,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q [M, K] e4m3 with sf [M, ceil(K/group_size)] (any layout) -> [M, K] in `dtype`: q * sf per group.

    Args:
        q: float8_e4m3fn [M, K].
        sf: float32 [M, ceil(K/group_size)] on q's device, any strides.
        group_size: the columns per scale q was quantized with (a multiple of 32 from 32 to 1024).
        dtype: float32 (default), bfloat16, float16 or float64.

    Raises:
        TypeError: `q` or `sf` is not a tensor or has the wrong dtype, or `dtype` is not allowed.
        ValueError: `group_size` is not allowed, `q` is not 2-D, `sf` has the wrong shape, or they are on
            two devices.

    Example::

        q, sf = deepgemm.quantize_per_token_group(torch.randn(64, 512, device="cuda"))
        x = deepgemm.dequantize_per_token_group(q, sf, dtype=torch.bfloat16)
    """
    where = "dequantize_per_token_group"
    require_int(group_size, "group_size", where, GROUP_SIZES)
    shape = tuple(q.shape) if isinstance(q, torch.Tensor) and q.dim() == 2 else (0, 0)
    _require_quantized(q, sf, where, (shape[0], ceil_div(shape[1], group_size)), "[M, ceil(K/group_size)]", dtype)
    return _dequantize_per_token_group(q, sf, group_size, dtype)


def dequantize_per_block(q: torch.Tensor, sf: torch.Tensor, block: int = 128,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q [N, K] e4m3 with sf [ceil(N/b), ceil(K/b)] -> [N, K] in `dtype`: q * sf per block x block tile.

    Args:
        q: float8_e4m3fn [N, K].
        sf: float32 [ceil(N/block), ceil(K/block)] on q's device.
        block: the tile edge q was quantized with (32, 64 or 128).
        dtype: float32 (default), bfloat16, float16 or float64.

    Raises:
        TypeError: `q` or `sf` is not a tensor or has the wrong dtype, or `dtype` is not allowed.
        ValueError: `block` is not allowed, `q` is not 2-D, `sf` has the wrong shape, or they are on two
            devices.

    Example::

        q, sf = deepgemm.quantize_per_block(torch.randn(256, 512, device="cuda"))
        w = deepgemm.dequantize_per_block(q, sf)           # float32 [256, 512]
    """
    where = "dequantize_per_block"
    require_int(block, "block", where, BLOCK_SIZES)
    shape = tuple(q.shape) if isinstance(q, torch.Tensor) and q.dim() == 2 else (0, 0)
    _require_quantized(q, sf, where, (ceil_div(shape[0], block), ceil_div(shape[1], block)), "[ceil(N/b), ceil(K/b)]",
                       dtype)
    return _dequantize_per_block(q, sf, block, dtype)
