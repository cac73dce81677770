"""The softmax (forward, backward) and RoPE kernels on an sm_90 GPU: fresh seeded inputs against float64 computed on
the CPU from the same inputs (tests/softmax_rope_helpers.py), every row class (a few threads a row, one CTA, a
cluster of CTAs, streaming), the 16-byte and the scalar paths, causal masks, NaN / inf as torch, gradients, RoPE in
the Llama / DeepSeek / partial-rotary layouts, in place on a fused qkv, CUDA-graph replay and bitwise repeatability.
The autouse gpu_guard fails any test where the reference path ran; each test also asserts its kernels launched."""

from __future__ import annotations

import pytest
import torch

import deepgemm
from deepgemm.kernels.softmax.launch import softmax_shape
from tests.gpu.guard import GpuGuard
from tests.helpers import poison_allocator
from tests.softmax_rope_helpers import (
    HALF_ULP,
    assert_rotation_close,
    assert_softmax_close,
    rope64,
    rope_cache,
    same_bits,
    softmax64,
)

pytestmark = pytest.mark.gpu

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
SOFTMAX = "deepgemm_softmax"
SOFTMAX_BACKWARD = "deepgemm_softmax_backward"
ROPE = "deepgemm_rope"
NAN, INF = float("nan"), float("inf")
# Largest |y - float64| of a softmax output (values <= 1): float32 math, else about one output ulp.
ATOL = {FP32: 2e-6, BF16: 4e-3, FP16: 1e-3}
quick = pytest.mark.quick


def dname(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cases(values: list[tuple], quick_ones: set[tuple], ids: list[str]) -> list:
    """pytest.params of `values`, the ones in `quick_ones` marked quick (the quick subset is chosen per case)."""
    return [pytest.param(*v, marks=[quick] if v in quick_ones else [], id=i) for v, i in zip(values, ids)]


def forward_launches(guard: GpuGuard) -> int:
    return guard.launches(SOFTMAX) - guard.launches(SOFTMAX_BACKWARD)


def scores(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Attention-score-like data on the GPU (normal x 3: peaked and flat rows alike), from the seeded generator."""
    return (torch.randn(shape, dtype=torch.float64) * 3).to(device="cuda", dtype=dtype)


def check_softmax(y: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """y (on the GPU) against float64: NaN where float64 has NaN only, max abs error within ATOL, element-wise within
    float32 math plus one output ulp, calc_diff < 1e-5."""
    rtol = 2e-5 if y.dtype == FP32 else 2 * HALF_ULP[y.dtype] + 2e-5
    assert_softmax_close(y, ref, what, rtol=rtol)
    y64 = y.double().cpu()
    finite = ~ref.isnan()
    if finite.any():
        err = (y64[finite] - ref[finite]).abs().max().item()
        assert err <= ATOL[y.dtype], f"{what}: max abs error {err:.3e} > {ATOL[y.dtype]:g}"
        if ref[finite].abs().sum() > 0:
            assert deepgemm.calc_diff(y64[finite], ref[finite]) < 1e-5, what


def row_class(n: int, dtype: torch.dtype, backward: bool = False, rows: int = 1) -> str:
    shape = softmax_shape(n, dtype, True, backward, rows, torch.cuda.get_device_properties(0).multi_processor_count)
    return "streaming" if shape.streaming else f"cluster{shape.cluster}" if shape.cluster > 1 else "cta"


# ---------------------------------------------------------------------------------------------- softmax forward

# (rows, n): n = 1, odd, a vector, past one vector, one CTA (4096), 4096 + one vector, the largest one-CTA bf16 row
# (32768), a cluster of 2 (40000), of 4 / 8 (131072 bf16 / fp32), streaming (300000; 200 rows of 40000: a CTA a row
# on every SM).
SHAPES = [(1, 1), (1000, 1), (3, 7), (1000, 8), (3, 100), (1000, 128), (3, 1000), (1, 4096), (1000, 4096), (3, 4104),
          (1, 32768), (3, 40000), (3, 131072), (2, 300000), (200, 40000)]
QUICK_SHAPES = {(BF16, 1000, 1), (BF16, 3, 7), (BF16, 1000, 128), (BF16, 1000, 4096), (BF16, 3, 4104),
                (BF16, 3, 40000), (BF16, 2, 300000), (FP32, 3, 100), (FP32, 1, 32768), (FP32, 3, 131072),
                (FP16, 1000, 8)}


@pytest.mark.parametrize("dtype,rows,n", cases(
    [(dtype, rows, n) for dtype in (BF16, FP32, FP16) for rows, n in SHAPES], QUICK_SHAPES,
    [f"{dname(dtype)}-{rows}x{n}" for dtype in (BF16, FP32, FP16) for rows, n in SHAPES]))
def test_softmax_matches_float64(dtype: torch.dtype, rows: int, n: int, gpu_guard: GpuGuard, seed: int) -> None:
    """Every row class and row count gives float64's softmax(scale x) within the dtype's rounding, writes every
    element (the output's memory held NaN), and is one launch."""
    x = scores((rows, n), dtype)
    poison_allocator(x.nbytes, count=1)
    before = forward_launches(gpu_guard)
    y = deepgemm.softmax(x, scale=0.3)
    torch.cuda.synchronize()
    assert forward_launches(gpu_guard) == before + 1
    assert y.shape == x.shape and y.dtype == dtype and y.is_cuda
    check_softmax(y, softmax64(x.cpu(), 0.3), f"{dtype} {rows}x{n} ({row_class(n, dtype, rows=rows)})")


@pytest.mark.parametrize("scale", [pytest.param(-1.5, marks=quick), 0.0, 1])
def test_softmax_scale_values(scale: float, gpu_guard: GpuGuard, seed: int) -> None:
    """A negative scale reverses the order, scale 0 gives exactly uniform rows, an int scale works."""
    x = scores((4, 3, 1000), BF16)
    y = deepgemm.softmax(x, scale=scale)
    check_softmax(y, softmax64(x.cpu(), float(scale)), f"scale {scale}")
    if scale == 0:
        assert torch.equal(y, torch.full_like(y, 1 / 1000))
    assert gpu_guard.launches(SOFTMAX) >= 1


# (id, n, view): the 16-byte path refused by a misaligned base (x[:, 1:]), by a row stride that is no 16-byte
# multiple, or by n; a strided last dimension (copied first); a view whose rows collapse onto an aligned stride.
VIEWS = [
    ("column-offset", 4096, lambda t, n: t[:, 1:n + 1]),
    ("column-offset-cluster", 40000, lambda t, n: t[:, 1:n + 1]),
    ("column-offset-streaming", 300000, lambda t, n: t[:, 1:n + 1]),
    ("odd-row-stride", 1000, lambda t, n: t.view(-1)[:t.shape[0] * (n + 1)].view(t.shape[0], n + 1)[:, :n]),
    ("strided-columns", 500, lambda t, n: t[:, :2 * n:2]),
    ("aligned-offset", 4096, lambda t, n: t[:, 8:n + 8]),
    ("transposed", 128, lambda t, n: t[:n, :t.shape[0]].t()),
]


@pytest.mark.parametrize("name,n,view,dtype", cases(
    [(*v, dtype) for v in VIEWS for dtype in (BF16, FP32)],
    {(*v, dtype) for v in VIEWS for dtype in (BF16, FP32)
     if (v[0], dtype) in (("column-offset", BF16), ("column-offset-cluster", FP32))},
    [f"{v[0]}-{dname(dtype)}" for v in VIEWS for dtype in (BF16, FP32)]))
def test_softmax_views_and_the_scalar_path(name: str, n: int, view, dtype: torch.dtype, gpu_guard: GpuGuard,
                                           seed: int) -> None:
    """Views the 16-byte path cannot read (misaligned base, unaligned row stride) take the scalar kernel, strided
    ones are copied: all give float64's values; the input is untouched."""
    base = scores((max(n, 9) + 16, n + 16) if name == "transposed" else (5, 2 * n + 16), dtype)
    x = view(base, n)
    snapshot = base.clone()
    y = deepgemm.softmax(x, scale=0.5)
    check_softmax(y, softmax64(x.cpu(), 0.5), name)
    assert same_bits(base, snapshot)
    assert forward_launches(gpu_guard) >= 1


# (batch, heads, sq, n): square, KV cache (sq < n: the last query sees every key), more queries than keys (blind
# queries give zero rows), on one CTA, a cluster and a streaming row.
CAUSAL = [(2, 4, 128, 128), (1, 2, 100, 1000), (1, 3, 1000, 100), (2, 1, 7, 7), (1, 1, 5, 40000),
          (1, 1, 3, 300000), (1, 2, 64, 4104)]


@pytest.mark.parametrize("shape,dtype", cases(
    [(s, dtype) for s in CAUSAL for dtype in (BF16, FP32, FP16)],
    {((2, 4, 128, 128), BF16), ((1, 3, 1000, 100), FP32), ((1, 1, 5, 40000), BF16)},
    ["x".join(map(str, s)) + f"-{dname(dtype)}" for s in CAUSAL for dtype in (BF16, FP32, FP16)]))
def test_causal_softmax(shape: tuple[int, int, int, int], dtype: torch.dtype, gpu_guard: GpuGuard,
                        seed: int) -> None:
    """causal=True hides key j from query i where j > i + n - sq (bottom-right aligned): hidden keys are exactly
    0, queries that see no key are zero rows, the rest is float64's masked softmax; every element written."""
    x = scores(shape, dtype)
    poison_allocator(x.nbytes, count=1)
    before = forward_launches(gpu_guard)
    y = deepgemm.softmax(x, scale=0.2, causal=True)
    torch.cuda.synchronize()
    assert forward_launches(gpu_guard) == before + 1
    sq, n = shape[-2:]
    check_softmax(y, softmax64(x.cpu(), 0.2, causal=True), f"causal {shape}")
    hidden = (torch.arange(n, device="cuda")[None] > torch.arange(sq, device="cuda")[:, None] + (n - sq))
    assert (y.masked_select(hidden.expand_as(y)) == 0).all()
    if sq > n:
        assert (y[..., :sq - n, :] == 0).all()


def special_rows(rows: int, n: int) -> torch.Tensor:
    """float64 rows: plain, one NaN, one +inf, all -inf, -inf in the first column, -inf and +inf, constant, NaN in
    the last column, the first half -inf (a left-padding mask)."""
    x = torch.randn(rows, n, dtype=torch.float64)
    x[1, n // 2] = NAN
    x[2, n // 3] = INF
    x[3] = -INF
    x[4, 0] = -INF
    x[5, 1], x[5, 2] = -INF, INF
    x[6] = 2.5
    x[7, -1] = NAN
    x[8, :n // 2] = -INF
    return x


@pytest.mark.parametrize("n,dtype", cases(
    [(n, dtype) for n in (16, 7, 4096, 40000, 300000) for dtype in (BF16, FP32)], {(16, BF16), (300000, FP32)},
    [f"{n}-{dname(dtype)}" for n in (16, 7, 4096, 40000, 300000) for dtype in (BF16, FP32)]))
def test_nan_and_inf_rows_match_torch(n: int, dtype: torch.dtype, gpu_guard: GpuGuard, seed: int) -> None:
    """A NaN or +inf in a row, or a row of -inf, gives a NaN row exactly where torch.softmax does (on every row
    class); -inf among finite values (one, or a left-padding run, also where a thread's first columns are all -inf)
    gives 0 there; finite rows are float64's and hold no NaN."""
    x = special_rows(9, n).to(device="cuda", dtype=dtype)
    y = deepgemm.softmax(x)
    want = torch.softmax(x.float(), dim=-1)
    assert torch.equal(y.isnan(), want.isnan()), f"n={n}: NaN rows differ from torch's"
    assert y[[1, 2, 3, 5, 7]].isnan().all() and not y[[0, 4, 6, 8]].isnan().any()
    assert y[4, 0] == 0 and (y[8, :n // 2] == 0).all()
    finite = [0, 4, 6, 8]
    check_softmax(y[finite], softmax64(x[finite].cpu()), f"finite rows n={n}")
    assert forward_launches(gpu_guard) == 1


def test_causal_hidden_nan_is_never_read(gpu_guard: GpuGuard, seed: int) -> None:
    """With causal=True NaN / inf in hidden keys do not reach the row, and a blind query is zeros even if NaN."""
    x = torch.randn(2, 6, 4, dtype=torch.float64)  # sq 6 > n 4: queries 0, 1 see nothing
    x[:, 0] = NAN
    x[:, 3, 2:] = INF
    x[:, 4, 3] = NAN
    x = x.to(device="cuda", dtype=BF16)
    y = deepgemm.softmax(x, causal=True)
    assert not y.isnan().any()
    assert (y[:, :2] == 0).all()
    check_softmax(y, softmax64(x.cpu(), causal=True), "hidden NaN")
    assert forward_launches(gpu_guard) == 1


# ---------------------------------------------------------------------------------------------- softmax backward


def softmax_grad64(x: torch.Tensor, grad: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    x64 = x.detach().double().cpu().requires_grad_()
    softmax64(x64, scale, causal).backward(grad.double().cpu())
    return x64.grad


def check_grad(dx: torch.Tensor, ref: torch.Tensor, grad: torch.Tensor, scale: float, what: str) -> None:
    """dx against float64 autograd: calc_diff within the output dtype's rounding, max error within the rounding of
    y and dy scaled by |scale| max|dy|, no NaN."""
    d = dx.double().cpu()
    assert not d.isnan().any(), f"{what}: NaN in the gradient"
    u = 2.0**-20 if dx.dtype == FP32 else HALF_ULP[dx.dtype]
    limit = 8 * u * abs(scale) * grad.double().abs().max().item() + 1e-30
    err = (d - ref).abs().max().item()
    assert err <= limit, f"{what}: max error {err:.3e} > {limit:.3e}"
    if ref.abs().sum() > 0:
        assert deepgemm.calc_diff(d, ref) < (1e-8 if dx.dtype == FP32 else 1e-4), what


BACKWARD = [(4, 7, False), (1000, 128, False), (8, 4096, True), (3, 40000, False), (2, 300000, False),
            (64, 100, True), (2, 32768, False)]


@pytest.mark.parametrize("rows,n,causal,dtype", cases(
    [(*c, dtype) for c in BACKWARD for dtype in (BF16, FP32)],
    {(4, 7, False, FP32), (8, 4096, True, BF16), (2, 300000, False, BF16)},
    [f"{r}x{n}{'-causal' if c else ''}-{dname(dtype)}" for r, n, c in BACKWARD for dtype in (BF16, FP32)]))
def test_softmax_backward_through_autograd(rows: int, n: int, causal: bool, dtype: torch.dtype,
                                           gpu_guard: GpuGuard, seed: int) -> None:
    """The gradient through deepgemm.softmax (one forward, one backward launch) is float64 autograd's, for every
    backward row class (one CTA, cluster, streaming); hidden keys get exactly 0."""
    x = scores((rows, n), dtype).requires_grad_()
    grad = torch.randn(rows, n, device="cuda").to(dtype)
    y = deepgemm.softmax(x, scale=-0.4, causal=causal)
    poison_allocator(x.nbytes, count=1)
    y.backward(grad)
    torch.cuda.synchronize()
    assert forward_launches(gpu_guard) == 1 and gpu_guard.launches(SOFTMAX_BACKWARD) == 1
    check_grad(x.grad, softmax_grad64(x, grad, -0.4, causal), grad, -0.4,
               f"{dtype} {rows}x{n} ({row_class(n, dtype, backward=True)})")
    if causal:
        hidden = torch.arange(n, device="cuda")[None] > torch.arange(rows, device="cuda")[:, None] + (n - rows)
        assert (x.grad[hidden] == 0).all()


def test_softmax_double_backward(gpu_guard: GpuGuard, seed: int) -> None:
    """A gradient of the gradient (create_graph=True) runs the fused backward kernel for d/d(dy) and equals float64
    autograd's."""
    x = torch.randn(64, 5, 1000)
    w = torch.randn(64, 5, 1000)
    x32 = x.cuda().requires_grad_()
    (g32,) = torch.autograd.grad((deepgemm.softmax(x32, scale=0.7, causal=True) * w.cuda()).sum(), x32,
                                 create_graph=True)
    g32.square().sum().backward()
    assert gpu_guard.launches("deepgemm_softmax_backward") >= 2
    x64 = x.double().requires_grad_()
    (g64,) = torch.autograd.grad((softmax64(x64, 0.7, True) * w.double()).sum(), x64, create_graph=True)
    g64.square().sum().backward()
    assert torch.allclose(g32.double().cpu(), g64, rtol=1e-4, atol=1e-7)
    assert torch.allclose(x32.grad.double().cpu(), x64.grad, rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("n", [pytest.param(1000, marks=quick), 8192, 40000])
def test_softmax_backward_op_on_misaligned_views(n: int, gpu_guard: GpuGuard, seed: int) -> None:
    """torch.ops.deepgemm.softmax_backward on views the 16-byte path refuses (x[:, 1:]) gives float64's
    scale y (dy - <dy, y>)."""
    y_base = torch.softmax(torch.randn(4, n + 8, dtype=torch.float64), dim=-1).to(device="cuda", dtype=BF16)
    dy_base = torch.randn(4, n + 8, device="cuda").to(BF16)
    y, dy = y_base[:, 1:n + 1], dy_base[:, 1:n + 1]
    dx = torch.ops.deepgemm.softmax_backward(y, dy, 0.7)
    y64, dy64 = y.double().cpu(), dy.double().cpu()
    ref = 0.7 * y64 * (dy64 - (dy64 * y64).sum(dim=-1, keepdim=True))
    check_grad(dx, ref, dy, 0.7, f"misaligned n={n}")
    assert gpu_guard.launches(SOFTMAX_BACKWARD) == 1


# ---------------------------------------------------------------------------------------------- RoPE

# (id, q heads, head_dim, kv heads, rotary_dim, interleaved)
MODELS = [
    ("llama", 32, 128, 8, 128, False),      # Llama-3 8B: GQA, full rotary, neox pairs
    ("deepseek", 16, 64, 1, 64, True),      # DeepSeek-V3's rope dims: q_pe [T, H, 64], k_pe [T, 1, 64], interleaved
    ("partial", 8, 128, 2, 32, False),      # partial rotary: features 32.. pass through
]
QUICK_ROPE = {("llama", BF16, 4096), ("deepseek", BF16, 4096), ("partial", BF16, 7), ("llama", FP32, 7),
              ("deepseek", FP16, 1)}


def rope_inputs(tokens: int, heads: int, dim: int, kv_heads: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    q = torch.randn(tokens, heads, dim, device="cuda").to(dtype)
    k = torch.randn(tokens, kv_heads, dim, device="cuda").to(dtype)
    return q, k


def check_rope(out: torch.Tensor, x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, interleaved: bool,
               what: str) -> None:
    """out (GPU) against float64 from x: rotated features within float32 error and one output ulp, pass-through
    features bit-identical."""
    rotary = cache.shape[1]
    ref, mag = rope64(x.cpu(), cache.cpu(), positions.cpu(), interleaved)
    assert_rotation_close(out[..., :rotary], ref[..., :rotary], mag[..., :rotary], what)
    assert same_bits(out[..., rotary:], x[..., rotary:]), f"{what}: pass-through features changed"


@pytest.mark.parametrize("model,dtype,tokens", [
    pytest.param(m, dtype, tokens, marks=[quick] if (m[0], dtype, tokens) in QUICK_ROPE else [],
                 id=f"{m[0]}-{dname(dtype)}-{tokens}")
    for m in MODELS for dtype in (BF16, FP32, FP16) for tokens in (1, 7, 4096)])
def test_rope_matches_float64(model: tuple, dtype: torch.dtype, tokens: int, gpu_guard: GpuGuard,
                              seed: int) -> None:
    """deepgemm.rope (one launch for q and k) on the model layouts: float64's rotation, pass-through features copied,
    every element written (outputs over NaN memory), inputs untouched."""
    name, heads, dim, kv_heads, rotary, interleaved = model
    q, k = rope_inputs(tokens, heads, dim, kv_heads, dtype)
    cache = rope_cache(8192, rotary, FP32).cuda()
    positions = torch.randint(0, 8192, (tokens,), device="cuda")
    q0, k0 = q.clone(), k.clone()
    poison_allocator(q.nbytes)
    poison_allocator(k.nbytes)
    before = gpu_guard.launches(ROPE)
    q_out, k_out = deepgemm.rope(q, k, cache, positions, interleaved=interleaved)
    torch.cuda.synchronize()
    assert gpu_guard.launches(ROPE) == before + 1
    assert same_bits(q, q0) and same_bits(k, k0)
    check_rope(q_out, q, cache, positions, interleaved, f"{name} q")
    check_rope(k_out, k, cache, positions, interleaved, f"{name} k")


@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("cache_dtype", ["same", FP32])
@pytest.mark.parametrize("position_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("interleaved", [pytest.param(False, id="neox"), pytest.param(True, id="interleaved")])
def test_rope_cache_and_position_dtypes(interleaved: bool, position_dtype: torch.dtype, cache_dtype: object,
                                        dtype: torch.dtype, gpu_guard: GpuGuard, seed: int) -> None:
    """A cache of the data's dtype or float32, int32 or int64 positions, both pair layouts, k=None: float64's
    rotation of the cache values as stored."""
    cache = rope_cache(4096, 64, dtype if cache_dtype == "same" else FP32).cuda()
    q = torch.randn(33, 6, 64, device="cuda").to(dtype)
    positions = torch.randint(0, 4096, (33,), device="cuda", dtype=position_dtype)
    q_out, k_out = deepgemm.rope(q, None, cache, positions, interleaved=interleaved)
    assert k_out is None
    check_rope(q_out, q, cache, positions, interleaved, "q")
    assert gpu_guard.launches(ROPE) == 1


# (id, make q from a fresh [T, H * D + 24] buffer): token / head strides the 16-byte path refuses or accepts.
ROPE_VIEWS = [
    ("misaligned-base", lambda t, h, d: t[:, 1:1 + h * d].view(t.shape[0], h, d)),
    ("odd-token-stride", lambda t, h, d: t.view(-1)[:t.shape[0] * (h * d + 1)].view(t.shape[0], h * d + 1)[:, :h * d]
     .view(t.shape[0], h, d)),
    ("aligned-offset", lambda t, h, d: t[:, 8:8 + h * d].view(t.shape[0], h, d)),
    ("head-major", lambda t, h, d: t[:, :h * d].reshape(h, t.shape[0], d).transpose(0, 1)),
    ("strided-head-dim", lambda t, h, d: t[:, :h * d].view(t.shape[0], h // 2, 2 * d)[..., ::2]),
]


@pytest.mark.parametrize("name,view,interleaved", cases(
    [(*v, il) for v in ROPE_VIEWS for il in (False, True)], {(*ROPE_VIEWS[0], True)},
    [f"{v[0]}-{'interleaved' if il else 'neox'}" for v in ROPE_VIEWS for il in (False, True)]))
def test_rope_views_and_the_scalar_path(name: str, view, interleaved: bool, gpu_guard: GpuGuard, seed: int) -> None:
    """q and k views with misaligned bases or strides (the scalar kernel), aligned offsets and head-major layouts
    (the 16-byte kernel, any strides), a strided head_dim (copied): float64's rotation; partial rotary."""
    tokens, heads, dim = 37, 8, 64
    buffer = torch.randn(tokens, heads * dim + 24, device="cuda").to(BF16)
    q = view(buffer, heads, dim)
    k = view(torch.randn(tokens, heads * dim + 24, device="cuda").to(BF16), heads, dim)[:, :2]
    cache = rope_cache(100, 32, BF16).cuda()
    positions = torch.randint(0, 100, (tokens,), device="cuda", dtype=torch.int32)
    q_out, k_out = deepgemm.rope(q, k, cache, positions, interleaved=interleaved)
    check_rope(q_out, q, cache, positions, interleaved, f"{name} q")
    check_rope(k_out, k, cache, positions, interleaved, f"{name} k")
    assert gpu_guard.launches(ROPE) == 1


@pytest.mark.parametrize("model,dtype", cases(
    [(m, dtype) for m in MODELS for dtype in (BF16, FP32, FP16)], {(MODELS[2], BF16), (MODELS[1], FP16)},
    [f"{m[0]}-{dname(dtype)}" for m in MODELS for dtype in (BF16, FP32, FP16)]))
def test_rope_in_place_on_fused_qkv(model: tuple, dtype: torch.dtype, gpu_guard: GpuGuard, seed: int) -> None:
    """rope_ on q and k views of one fused qkv buffer with NaN-filled padding columns: q and k are rope's result bit
    for bit, v, the padding and every pass-through feature keep their bits; one launch."""
    name, heads, dim, kv_heads, rotary, interleaved = model
    tokens, pad = 300, 8
    width = (heads + 2 * kv_heads) * dim
    qkv = torch.randn(tokens, width + pad, device="cuda").to(dtype)
    qkv[:, width:] = NAN
    before = qkv.clone()
    q = qkv[:, :heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    cache = rope_cache(2048, rotary, FP32).cuda()
    positions = torch.randint(0, 2048, (tokens,), device="cuda")
    want_q, want_k = deepgemm.rope(q, k, cache, positions, interleaved=interleaved)
    assert deepgemm.rope_(q, k, cache, positions, interleaved=interleaved) is None
    torch.cuda.synchronize()
    assert gpu_guard.launches(ROPE) == 2
    assert same_bits(q, want_q) and same_bits(k, want_k)
    assert same_bits(qkv[:, (heads + kv_heads) * dim:], before[:, (heads + kv_heads) * dim:]), "v / padding written"
    heads_view = qkv[:, :width].view(tokens, heads + 2 * kv_heads, dim)
    old_view = before[:, :width].view(tokens, heads + 2 * kv_heads, dim)
    assert same_bits(heads_view[..., rotary:], old_view[..., rotary:]), "a pass-through feature changed"
    check_rope(q, old_view[:, :heads], cache, positions, interleaved, f"{name} q in place")


@pytest.mark.parametrize("position_dtype", [pytest.param(torch.int64, marks=quick, id="int64"),
                                            pytest.param(torch.int32, id="int32")])
def test_out_of_range_positions_give_nan(position_dtype: torch.dtype, gpu_guard: GpuGuard, seed: int) -> None:
    """A position < 0 or >= P makes that token's rotated features NaN (rope and rope_, q and k); its pass-through
    features and the other tokens are exact."""
    huge = 2**40 if position_dtype == torch.int64 else 2**31 - 1
    positions = torch.tensor([5, -1, 99, 100, 0, huge, -huge], device="cuda", dtype=position_dtype)
    broken = torch.tensor([False, True, False, True, False, True, True], device="cuda")
    cache = rope_cache(100, 32, FP32).cuda()
    q, k = rope_inputs(7, 4, 64, 2, BF16)
    q_out, k_out = deepgemm.rope(q, k, cache, positions)
    q_in, k_in = q.clone(), k.clone()
    deepgemm.rope_(q_in, k_in, cache, positions)
    assert gpu_guard.launches(ROPE) == 2
    for x, outs in ((q, (q_out, q_in)), (k, (k_out, k_in))):
        for out in outs:
            assert out[broken, :, :32].isnan().all()
            assert not out[~broken].isnan().any()
            assert same_bits(out[..., 32:], x[..., 32:])
            check_rope(out[~broken], x[~broken], cache, positions[~broken], False, "valid tokens")


@pytest.mark.parametrize("interleaved", [pytest.param(False, id="neox", marks=quick),
                                         pytest.param(True, id="interleaved")])
def test_rope_gradients(interleaved: bool, gpu_guard: GpuGuard, seed: int) -> None:
    """Gradients through deepgemm.rope (the inverse rotation, one launch) are float64 autograd's."""
    cache = rope_cache(512, 64, FP32).cuda()
    positions = torch.randint(0, 512, (129,), device="cuda")
    q = torch.randn(129, 8, 128, device="cuda").to(BF16).requires_grad_()
    k = torch.randn(129, 2, 128, device="cuda").to(BF16).requires_grad_()
    q_out, k_out = deepgemm.rope(q, k, cache, positions, interleaved=interleaved)
    gq, gk = torch.randn_like(q_out), torch.randn_like(k_out)
    torch.autograd.backward((q_out, k_out), (gq, gk))
    assert gpu_guard.launches(ROPE) == 2
    for x, g in ((q, gq), (k, gk)):
        x64 = x.detach().double().cpu().requires_grad_()
        rope64(x64, cache.cpu(), positions.cpu(), interleaved)[0].backward(g.double().cpu())
        _, mag = rope64(g.cpu(), cache.cpu(), positions.cpu(), interleaved, inverse=True)
        assert_rotation_close(x.grad, x64.grad, mag, "gradient")


# ---------------------------------------------------------------------------------------------- graphs, repeatability


@quick
def test_softmax_cuda_graph_replay(gpu_guard: GpuGuard, seed: int) -> None:
    """softmax warmed eagerly, captured in a CUDA graph (causal, a cluster row length) and replayed on new values
    copied into the captured input: each replay gives float64's result for the new values."""
    static_x = scores((2, 8, 40000), BF16)
    deepgemm.softmax(static_x, scale=0.1, causal=True)  # warm: compiled and loaded before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = deepgemm.softmax(static_x, scale=0.1, causal=True)
    for _ in range(2):
        static_x.copy_(scores(static_x.shape, BF16))
        static_y.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        check_softmax(static_y, softmax64(static_x.cpu(), 0.1, causal=True), "replay")
    assert forward_launches(gpu_guard) == 2


@quick
def test_rope_in_place_cuda_graph_replay(gpu_guard: GpuGuard, seed: int) -> None:
    """rope_ on a fused qkv, warmed, captured and replayed with new qkv values and new positions copied into the
    captured tensors: each replay rotates the new values by the new positions."""
    tokens, heads, kv_heads, dim = 64, 8, 2, 128
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, device="cuda").to(BF16)
    q = qkv[:, :heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    cache = rope_cache(4096, dim, FP32).cuda()
    positions = torch.randint(0, 4096, (tokens,), device="cuda", dtype=torch.int32)
    deepgemm.rope_(q, k, cache, positions)  # warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deepgemm.rope_(q, k, cache, positions)
    for _ in range(2):
        fresh = torch.randn_like(qkv, dtype=FP32).to(BF16)
        qkv.copy_(fresh)
        positions.copy_(torch.randint(0, 4096, (tokens,), device="cuda", dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        original = fresh[:, :heads * dim].view(tokens, heads, dim)
        check_rope(q, original, cache, positions, False, "replayed q")
        assert same_bits(qkv[:, (heads + kv_heads) * dim:], fresh[:, (heads + kv_heads) * dim:])
    assert gpu_guard.launches(ROPE) == 2


def test_capturing_a_cold_rope_raises_graph_capture_error(gpu_guard: GpuGuard) -> None:
    """A kernel variant not yet loaded in this process cannot be compiled or loaded inside a capture: rope_ raises
    GraphCaptureError (a variant no other test uses: float16 data, a bfloat16 cache, rotary 48, interleaved)."""
    q = torch.randn(5, 3, 48, device="cuda").to(FP16)
    cache = rope_cache(16, 48, BF16).cuda()
    positions = torch.arange(5, device="cuda", dtype=torch.int32)
    with pytest.raises(deepgemm.GraphCaptureError), torch.cuda.graph(torch.cuda.CUDAGraph()):
        deepgemm.rope_(q, None, cache, positions, interleaved=True)
    deepgemm.rope_(q, None, cache, positions, interleaved=True)  # eagerly it runs
    assert gpu_guard.launches(ROPE) == 1


@quick
def test_bitwise_repeatable(gpu_guard: GpuGuard, seed: int) -> None:
    """Two calls on the same inputs give the same bits (softmax on a one-CTA, a cluster and a streaming row, its
    backward, rope), and rope_ writes rope's bits."""
    for shape in ((1000, 4096), (3, 40000), (2, 300000)):
        x = scores(shape, BF16)
        assert same_bits(deepgemm.softmax(x, scale=0.5), deepgemm.softmax(x, scale=0.5)), shape
        y, dy = deepgemm.softmax(x), torch.randn(shape, device="cuda").to(BF16)
        assert same_bits(torch.ops.deepgemm.softmax_backward(y, dy, 0.5),
                         torch.ops.deepgemm.softmax_backward(y, dy, 0.5)), shape
    q, k = rope_inputs(4096, 32, 128, 8, BF16)
    cache = rope_cache(8192, 128, FP32).cuda()
    positions = torch.randint(0, 8192, (4096,), device="cuda")
    first, second = deepgemm.rope(q, k, cache, positions), deepgemm.rope(q, k, cache, positions)
    assert same_bits(first[0], second[0]) and same_bits(first[1], second[1])
    deepgemm.rope_(q, k, cache, positions)
    assert same_bits(q, first[0]) and same_bits(k, first[1])
    assert forward_launches(gpu_guard) == 9 and gpu_guard.launches(SOFTMAX_BACKWARD) == 6
    assert gpu_guard.launches(ROPE) == 3
