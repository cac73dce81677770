"""deepgemm.softmax, deepgemm.rope and deepgemm.rope_ on CPU (the reference path serves): values against the float64
formulas of tests/softmax_rope_helpers.py (not deepgemm.reference), NaN / inf rules against torch, gradients against
float64 autograd, every argument rule, torch.compile(fullgraph=True) and torch.library.opcheck of the custom ops."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._dynamo

import deepgemm
from tests.helpers import GraphRecorder
from tests.softmax_rope_helpers import (
    HALF_ULP,
    TINY,
    assert_rotation_close,
    assert_softmax_close,
    rope64,
    rope_cache,
    same_bits,
    softmax64,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NAN = float("nan")
INF = float("inf")


def scores(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Attention-score-like input: normal values times 3 (peaked and flat rows alike), rounded to dtype."""
    return (torch.randn(shape, dtype=torch.float64) * 3).to(dtype)


# ---------------------------------------------------------------------------------------------- softmax values


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7,), (5, 1), (3, 100), (2, 4097), (2, 3, 7), (2, 3, 4, 100)],
                         ids=lambda s: "x".join(map(str, s)))
def test_softmax_matches_float64(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> None:
    """Every shape (n = 1, odd n, n past 4096, 1-D to 4-D) gives softmax(scale x) over the last dimension in the
    input's dtype, a new tensor, with the input untouched."""
    x = scores(shape, dtype)
    before = x.clone()
    y = deepgemm.softmax(x, scale=0.37)
    assert y.dtype == dtype and y.is_contiguous() and y.data_ptr() != x.data_ptr()
    assert same_bits(x, before)
    assert_softmax_close(y, softmax64(x, 0.37), f"{dtype} {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.125, 3, -2.0, 0.0, -0.0])
def test_softmax_scales(dtype: torch.dtype, scale: float, seed: int) -> None:
    """Any finite scale multiplies x before the softmax: a negative one flips the order, 0 gives uniform rows, an
    int is taken as a float."""
    x = scores((3, 5, 100), dtype)
    y = deepgemm.softmax(x, scale=scale)
    assert_softmax_close(y, softmax64(x, float(scale)), f"scale {scale}")
    if scale == 0:
        assert torch.equal(y, torch.full_like(y, 1 / 100))


@pytest.mark.parametrize("view", ["transposed", "column-offset", "strided-columns", "permuted", "expanded"])
def test_softmax_non_contiguous_views(view: str, seed: int) -> None:
    """Views whose rows do not collapse, whose last dimension is strided, or that broadcast give the values of
    their contiguous copy."""
    base = scores((6, 9, 40), torch.bfloat16)
    x = {"transposed": lambda t: t[0].t(), "column-offset": lambda t: t[:, :, 1:],
         "strided-columns": lambda t: t[..., ::3], "permuted": lambda t: t.permute(1, 0, 2),
         "expanded": lambda t: t[:1, :1].expand(4, 9, 40)}[view](base)
    assert not x.is_contiguous()
    y = deepgemm.softmax(x, scale=0.5, causal=view == "permuted")
    assert y.is_contiguous()
    assert_softmax_close(y, softmax64(x, 0.5, causal=view == "permuted"), view)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq,n", [(5, 5), (1, 1), (3, 8), (1, 100), (8, 3), (100, 1), (64, 64)])
def test_causal_mask_is_bottom_right_aligned(dtype: torch.dtype, sq: int, n: int, seed: int) -> None:
    """causal=True over [batch, heads, sq, n]: query i sees keys j <= i + n - sq (the upper triangle hidden when
    sq == n, the last query sees every key when sq < n); hidden keys are exactly 0, a query that sees no key
    (sq > n) is a row of zeros, the others sum to 1."""
    x = scores((2, 3, sq, n), dtype)
    y = deepgemm.softmax(x, scale=-0.7, causal=True)
    ref = softmax64(x, -0.7, causal=True)
    assert_softmax_close(y, ref, f"causal {sq}x{n}")
    i, j = torch.arange(sq).unsqueeze(1), torch.arange(n).unsqueeze(0)
    hidden = j > i + (n - sq)
    assert (y.masked_select(hidden.expand_as(y)) == 0).all()
    blind = hidden.all(dim=1)  # queries that see nothing
    assert int(blind.sum()) == max(0, sq - n)
    sums = y.double().sum(dim=-1)
    assert torch.allclose(sums[..., ~blind], torch.ones_like(sums[..., ~blind]), atol=n * 2 * HALF_ULP[dtype])


def test_causal_reads_the_last_two_dimensions_of_a_view(seed: int) -> None:
    """The mask follows the logical [..., sq, n] indices of a non-contiguous view (a transposed score matrix)."""
    x = scores((2, 12, 10), torch.float32).transpose(1, 2)  # [2, 10, 12]
    assert_softmax_close(deepgemm.softmax(x, causal=True), softmax64(x, causal=True), "transposed causal")


def test_softmax_empty_inputs() -> None:
    """Empty tensors (no rows, no columns, no queries) give empty results of the same shape and dtype."""
    for shape, causal in (((0, 5), False), ((3, 0), False), ((2, 0, 4), True), ((2, 4, 0), True)):
        y = deepgemm.softmax(torch.empty(shape, dtype=torch.bfloat16), causal=causal)
        assert y.shape == shape and y.dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------- NaN and infinity


def special_rows(n: int) -> torch.Tensor:
    """Rows: plain, one NaN, one +inf, all -inf, one -inf among finite values, -inf and +inf, all equal, huge."""
    rows = torch.randn(8, n, dtype=torch.float64)
    rows[1, 3] = NAN
    rows[2, 5] = INF
    rows[3] = -INF
    rows[4, 0] = -INF
    rows[5, 1], rows[5, 2] = -INF, INF
    rows[6] = 2.5
    rows[7] = rows[7] * 1e4
    return rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, -1.0, 0.0])
def test_nan_and_inf_follow_torch(dtype: torch.dtype, scale: float, seed: int) -> None:
    """A NaN or +inf in scale x, or a row of -inf, makes the row NaN (torch.softmax's result, also where a
    negative scale turns -inf into +inf and scale 0 turns inf into NaN); a single -inf gives 0; the finite rows
    match float64."""
    x = special_rows(16).to(dtype)
    y = deepgemm.softmax(x, scale=scale)
    want = torch.softmax(x.float() * scale, dim=-1)
    assert torch.equal(y.isnan(), want.isnan())
    assert y.isnan().all(dim=-1).eq(want.isnan().any(dim=-1)).all(), "a NaN row must be NaN throughout"
    finite_rows = ~want.isnan().any(dim=-1)
    assert_softmax_close(y[finite_rows], softmax64(x[finite_rows], scale), "finite rows")
    if scale == 1.0:
        assert y[4, 0] == 0 and y[1].isnan().all() and y[3].isnan().all()


def test_causal_hidden_nan_does_not_leak(seed: int) -> None:
    """With causal=True, NaN or inf in hidden positions is never read: the row is finite; a query that sees no key
    is zeros even when its row is NaN; a query whose visible keys are all -inf is NaN (as torch)."""
    x = torch.randn(4, 3, dtype=torch.float32)  # sq 4 > n 3: query 0 sees nothing, query i sees keys <= i - 1
    x[0] = NAN
    x[1, 1:] = torch.tensor([NAN, INF])
    x[2, 0:2] = -INF
    x[3, 2] = 1.0
    y = deepgemm.softmax(x, causal=True)
    assert torch.equal(y[0], torch.zeros(3))
    assert torch.equal(y[1], torch.tensor([1.0, 0.0, 0.0]))
    assert y[2].isnan().all()
    assert_softmax_close(y[3:], softmax64(x, causal=True)[3:], "finite query")


# ---------------------------------------------------------------------------------------------- softmax gradients


def softmax_grad64(x: torch.Tensor, grad: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    x64 = x.detach().double().requires_grad_()
    softmax64(x64, scale, causal).backward(grad.double())
    return x64.grad


def assert_softmax_grad_close(dx: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, grad: torch.Tensor,
                              scale: float, causal: bool) -> None:
    """dx = scale y (dy - <dy, y>) within the rounding of y, dy and dx to the dtype (float32: its math error)."""
    u = 2.0**-20 if dx.dtype == torch.float32 else HALF_ULP[dx.dtype]
    y = softmax64(x, scale, causal)
    g = grad.double()
    dot = (g * y).sum(dim=-1, keepdim=True)
    y_error = u * y + TINY[dx.dtype]  # y's rounding (float16's subnormals: an absolute step)
    bound = 4 * abs(scale) * y_error * (g.abs() + dot.abs() + g.abs().amax(dim=-1, keepdim=True)) \
        + 2 * u * ref.abs() + TINY[dx.dtype]
    excess = (dx.double() - ref).abs() - bound
    assert excess.max().item() <= 0, f"gradient exceeds the bound by {excess.max().item():.3e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,scale,causal", [((4, 7), 1.0, False), ((3, 2, 100), -0.6, False),
                                                ((2, 6, 6), 0.3, True), ((2, 3, 9), 2.0, True),
                                                ((2, 9, 3), 0.5, True), ((2, 1), 1.0, False)],
                         ids=["4x7", "3x2x100-neg", "causal-square", "causal-kv", "causal-blind", "n1"])
def test_softmax_gradient_matches_float64_autograd(dtype: torch.dtype, shape: tuple[int, ...], scale: float,
                                                   causal: bool, seed: int) -> None:
    """The gradient through deepgemm.softmax (the custom op's backward) equals float64 autograd of the formula:
    hidden keys and blind queries get exactly 0."""
    x = scores(shape, dtype).requires_grad_()
    y = deepgemm.softmax(x, scale=scale, causal=causal)
    assert y.requires_grad and y.grad_fn is not None
    grad = torch.randn(shape, dtype=torch.float64).to(dtype)
    y.backward(grad)
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    ref = softmax_grad64(x, grad, scale, causal)
    assert_softmax_grad_close(x.grad, ref, x.detach(), grad, scale, causal)
    if causal:
        sq, n = shape[-2:]
        hidden = torch.arange(n).unsqueeze(0) > torch.arange(sq).unsqueeze(1) + (n - sq)
        assert (x.grad.masked_select(hidden.expand(shape)) == 0).all()


def test_softmax_gradient_through_a_view_and_a_chain(seed: int) -> None:
    """A non-contiguous leaf and softmax feeding further ops: autograd reaches the leaf with float64's gradient."""
    base = torch.randn(7, 30, dtype=torch.float32, requires_grad=True)
    x = base.t()[:, 1:]  # [30, 6], strided
    w = torch.randn(6, 5)
    loss = (deepgemm.softmax(x, scale=0.8) @ w).square().sum()
    loss.backward()
    base64 = base.detach().double().requires_grad_()
    (softmax64(base64.t()[:, 1:], 0.8) @ w.double()).square().sum().backward()
    assert torch.allclose(base.grad.double(), base64.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_softmax_double_backward_matches_float64(causal: bool, seed: int) -> None:
    """A gradient of the gradient (create_graph=True, e.g. a gradient penalty) goes through softmax_backward's own
    autograd formula and equals float64 autograd's: no silently dropped term."""
    x = torch.randn(2, 5, 7)
    w = torch.randn(2, 5, 7)
    x32 = x.clone().requires_grad_()
    x64 = x.double().requires_grad_()
    (g32,) = torch.autograd.grad((deepgemm.softmax(x32, scale=0.7, causal=causal) * w).sum(), x32, create_graph=True)
    (g64,) = torch.autograd.grad((softmax64(x64, 0.7, causal) * w.double()).sum(), x64, create_graph=True)
    g32.square().sum().backward()
    g64.square().sum().backward()
    assert torch.allclose(g32.double(), g64, rtol=1e-5, atol=1e-7)
    assert torch.allclose(x32.grad.double(), x64.grad, rtol=1e-4, atol=1e-7)


def test_softmax_without_grad_records_nothing(seed: int) -> None:
    """Under no_grad (or for an input that needs no grad) the result has no graph."""
    x = torch.randn(3, 8, requires_grad=True)
    with torch.no_grad():
        assert not deepgemm.softmax(x).requires_grad
    assert not deepgemm.softmax(x.detach()).requires_grad


# ---------------------------------------------------------------------------------------------- RoPE values

# (id, tokens, q heads, q head_dim, k heads or None, k head_dim, rotary_dim)
ROPE_LAYOUTS = [
    ("llama", 7, 4, 16, 2, 16, 16),         # full rotary, GQA
    ("partial", 5, 3, 24, 1, 24, 8),        # partial rotary: features 8.. pass through
    ("q-only", 6, 2, 10, None, 0, 10),
    ("k-wider", 4, 2, 12, 3, 20, 12),       # k's head_dim differs from q's, rotary = q's head_dim
    ("one-token-one-pair", 1, 1, 2, 1, 2, 2),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache_dtype", ["same", torch.float32])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("layout", ROPE_LAYOUTS, ids=[r[0] for r in ROPE_LAYOUTS])
def test_rope_matches_float64(layout: tuple, interleaved: bool, cache_dtype: torch.dtype | str, dtype: torch.dtype,
                              seed: int) -> None:
    """The first R features of every head rotate pair by pair (both layouts), features R.. are copied bit for bit,
    the inputs are untouched, and the outputs are new contiguous tensors of the inputs' shapes."""
    _, tokens, heads, dim, kv_heads, kv_dim, rotary = layout
    cache = rope_cache(50, rotary, dtype if cache_dtype == "same" else cache_dtype)
    q = torch.randn(tokens, heads, dim).to(dtype)
    k = None if kv_heads is None else torch.randn(tokens, kv_heads, kv_dim).to(dtype)
    positions = torch.randint(0, 50, (tokens,), dtype=torch.int32 if interleaved else torch.int64)
    q0, k0 = q.clone(), None if k is None else k.clone()
    q_out, k_out = deepgemm.rope(q, k, cache, positions, interleaved=interleaved)
    for name, x, x0, out in (("q", q, q0, q_out), ("k", k, k0, k_out)):
        if x is None:
            assert out is None
            continue
        assert same_bits(x, x0), f"{name} was written"
        assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
        ref, mag = rope64(x, cache, positions, interleaved)
        assert_rotation_close(out[..., :rotary], ref[..., :rotary], mag[..., :rotary], name)
        assert same_bits(out[..., rotary:], x[..., rotary:]), f"{name}'s pass-through features changed"


def test_rope_pair_layouts_differ_as_documented() -> None:
    """With one token at angle theta on every pair, neox rotates (x[p], x[p + R/2]) and interleaved
    (x[2p], x[2p + 1]): checked on a hand-made vector."""
    theta = torch.tensor(0.5, dtype=torch.float64)
    cache = torch.tensor([[theta.cos(), theta.cos(), theta.sin(), theta.sin()]]).float()  # R = 4, two pairs
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0, 9.0]]])
    c, s = float(theta.cos()), float(theta.sin())
    neox, _ = deepgemm.rope(x, None, cache, torch.tensor([0]))
    inter, _ = deepgemm.rope(x, None, cache, torch.tensor([0]), interleaved=True)
    want_neox = [1 * c - 3 * s, 2 * c - 4 * s, 3 * c + 1 * s, 4 * c + 2 * s, 9.0]
    want_inter = [1 * c - 2 * s, 2 * c + 1 * s, 3 * c - 4 * s, 4 * c + 3 * s, 9.0]
    assert torch.allclose(neox[0, 0].double(), torch.tensor(want_neox, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(inter[0, 0].double(), torch.tensor(want_inter, dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_rope_accepts_strided_views(interleaved: bool, seed: int) -> None:
    """q and k may be any views (token/head strides of a fused projection, a transposed [H, T, D] tensor, a strided
    head_dim); positions may be a strided view; the cache may be a column slice."""
    qkv = torch.randn(9, (4 + 2 * 2) * 16).to(torch.bfloat16)
    q = qkv[:, :64].view(9, 4, 16)
    k = torch.randn(2, 9, 32).to(torch.bfloat16).transpose(0, 1)[..., ::2]  # [9, 2, 16], head_dim stride 2
    big_cache = rope_cache(40, 24, torch.float32)
    cache = torch.cat((big_cache[:, :6], big_cache[:, 12:18]), dim=1).t().contiguous().t()  # [40, 12] column-major
    positions = torch.arange(18, dtype=torch.int64)[::2].flip(0)
    q_out, k_out = deepgemm.rope(q, k, cache, positions, interleaved=interleaved)
    for x, out in ((q, q_out), (k, k_out)):
        ref, mag = rope64(x, cache, positions, interleaved)
        assert_rotation_close(out[..., :12], ref[..., :12], mag[..., :12], "view")
        assert same_bits(out[..., 12:], x[..., 12:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_rope_in_place_on_a_fused_qkv(dtype: torch.dtype, interleaved: bool, seed: int) -> None:
    """rope_ on q and k views of one fused qkv projection (GQA, partial rotary) writes exactly rope's result into
    them and leaves v and every pass-through feature bit-identical; it returns None."""
    tokens, heads, kv_heads, dim, rotary = 11, 4, 2, 32, 16
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(dtype)
    before = qkv.clone()
    q = qkv[:, :heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    cache = rope_cache(64, rotary, torch.float32)
    positions = torch.randint(0, 64, (tokens,), dtype=torch.int32)
    want_q, want_k = deepgemm.rope(q, k, cache, positions, interleaved=interleaved)
    assert deepgemm.rope_(q, k, cache, positions, interleaved=interleaved) is None
    assert same_bits(q, want_q) and same_bits(k, want_k)
    assert same_bits(qkv[:, (heads + kv_heads) * dim:], before[:, (heads + kv_heads) * dim:]), "v was written"
    fused = before.view(tokens, heads + 2 * kv_heads, dim)
    assert same_bits(qkv.view_as(fused)[..., rotary:], fused[..., rotary:]), "a pass-through feature changed"
    ref, mag = rope64(before[:, :heads * dim].view(tokens, heads, dim), cache, positions, interleaved)
    assert_rotation_close(q[..., :rotary], ref[..., :rotary], mag[..., :rotary], "q in place")


@pytest.mark.parametrize("position_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("in_place", [False, True], ids=["rope", "rope_"])
def test_out_of_range_positions_give_nan_rotated_features(position_dtype: torch.dtype, in_place: bool,
                                                          seed: int) -> None:
    """A position < 0 or >= P (also past int32 as int64) makes that token's rotated features NaN, in q and k; its
    pass-through features and every other token stay exact."""
    tokens, positions_count, rotary = 6, 10, 8
    bad = [-1, 10, 2**31 - 1] if position_dtype == torch.int32 else [-(2**40), 10, 2**33]
    positions = torch.tensor([3, bad[0], 9, bad[1], 0, bad[2]], dtype=position_dtype)
    broken = torch.tensor([False, True, False, True, False, True])
    cache = rope_cache(positions_count, rotary, torch.float32)
    q = torch.randn(tokens, 3, 12)
    k = torch.randn(tokens, 1, 12)
    if in_place:
        q_out, k_out = q.clone(), k.clone()
        deepgemm.rope_(q_out, k_out, cache, positions)
    else:
        q_out, k_out = deepgemm.rope(q, k, cache, positions)
    for x, out in ((q, q_out), (k, k_out)):
        assert out[broken, :, :rotary].isnan().all()
        assert not out[~broken].isnan().any() and not out[..., rotary:].isnan().any()
        assert same_bits(out[..., rotary:], x[..., rotary:])
        ref, mag = rope64(x[~broken], cache, positions[~broken], False)
        assert_rotation_close(out[~broken], ref, mag, "valid tokens")


def test_rope_empty_inputs() -> None:
    """No tokens: rope gives empty tensors of the inputs' shapes, rope_ does nothing."""
    cache = rope_cache(4, 8, torch.float32)
    q, k = torch.empty(0, 2, 8), torch.empty(0, 1, 8)
    q_out, k_out = deepgemm.rope(q, k, cache, torch.empty(0, dtype=torch.int64))
    assert q_out.shape == (0, 2, 8) and k_out.shape == (0, 1, 8)
    assert deepgemm.rope_(q, k, cache, torch.empty(0, dtype=torch.int32)) is None


def test_rope_op_inverse_undoes_the_rotation(seed: int) -> None:
    """The custom op's inverse=True (the backward) rotates by -theta: float64's inverse rotation, and rope then
    inverse gives back the input within float32 rounding."""
    q = torch.randn(5, 3, 16)
    cache = rope_cache(20, 16, torch.float32)
    positions = torch.randint(0, 20, (5,))
    back, empty = torch.ops.deepgemm.rope(q, None, cache, positions, True, True)
    assert empty.shape == (5, 0, 16)
    ref, mag = rope64(q, cache, positions, True, inverse=True)
    assert_rotation_close(back, ref, mag, "inverse")
    there, _ = torch.ops.deepgemm.rope(q, None, cache, positions, False, False)
    again, _ = torch.ops.deepgemm.rope(there, None, cache, positions, False, True)
    assert torch.allclose(again, q, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------- RoPE gradients


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("which", ["q-and-k", "q-only", "k-only", "no-k"])
def test_rope_gradients_match_float64_autograd(dtype: torch.dtype, interleaved: bool, which: str,
                                               seed: int) -> None:
    """Gradients of q and k through deepgemm.rope are float64 autograd's (the inverse rotation, pass-through
    features get the output gradient unchanged); an input that needs no grad gets none."""
    tokens, rotary = 6, 8
    cache = rope_cache(30, rotary, torch.float32)
    positions = torch.randint(0, 30, (tokens,))
    q = torch.randn(tokens, 4, 12).to(dtype).requires_grad_(which != "k-only")
    k = None if which == "no-k" else torch.randn(tokens, 2, 8).to(dtype).requires_grad_(which != "q-only")
    q_out, k_out = deepgemm.rope(q, k, cache, positions, interleaved=interleaved)
    gq = torch.randn(q.shape).to(dtype)
    gk = None if k is None else torch.randn(k.shape).to(dtype)
    loss = (q_out.float() * gq.float()).sum() + (0 if k is None else (k_out.float() * gk.float()).sum())
    loss.backward()
    for x, g in ((q, gq), (k, gk)):
        if x is None:
            continue
        if not x.requires_grad:
            assert x.grad is None
            continue
        x64 = x.detach().double().requires_grad_()
        out64, _ = rope64(x64, cache, positions, interleaved)
        out64.backward(g.double())
        _, mag = rope64(g, cache, positions, interleaved, inverse=True)
        assert x.grad.dtype == dtype
        assert_rotation_close(x.grad, x64.grad, mag, "gradient")
        assert same_bits(x.grad[..., rotary:], g[..., rotary:])


# ---------------------------------------------------------------------------------------------- argument rules

X = torch.randn(3, 4)


def _rope_args(**changes: object) -> dict[str, object]:
    args: dict[str, object] = {"q": torch.randn(4, 2, 8), "k": torch.randn(4, 1, 8),
                               "cos_sin_cache": torch.randn(10, 8), "positions": torch.arange(4),
                               "interleaved": False}
    args.update(changes)
    return args


def _huge(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor of that many elements that owns one (an expanded scalar): sizes past 2^31 without the memory."""
    return torch.zeros((1,) * len(shape), dtype=dtype).expand(shape)


SOFTMAX_RULES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("x-list", lambda: deepgemm.softmax([1.0, 2.0]), TypeError, "'x' must be a torch.Tensor"),
    ("x-int", lambda: deepgemm.softmax(torch.ones(3, dtype=torch.int32)), TypeError, "'x' must have dtype"),
    ("x-float64", lambda: deepgemm.softmax(X.double()), TypeError, "'x' must have dtype"),
    ("x-sparse", lambda: deepgemm.softmax(X.to_sparse()), TypeError, "'x' must be a dense"),
    ("x-0d", lambda: deepgemm.softmax(torch.tensor(1.0)), ValueError, "'x' must have at least 1 dimension"),
    ("causal-1d", lambda: deepgemm.softmax(torch.randn(5), causal=True), ValueError, "causal=True needs x"),
    ("causal-int", lambda: deepgemm.softmax(X, causal=1), TypeError, "'causal' must be a bool"),
    ("causal-none", lambda: deepgemm.softmax(X, causal=None), TypeError, "'causal' must be a bool"),
    ("scale-bool", lambda: deepgemm.softmax(X, scale=True), TypeError, "'scale' must be a real number"),
    ("scale-str", lambda: deepgemm.softmax(X, scale="2"), TypeError, "'scale' must be a real number"),
    ("scale-tensor", lambda: deepgemm.softmax(X, scale=torch.tensor(2.0)), TypeError, "'scale' must be a real"),
    ("scale-inf", lambda: deepgemm.softmax(X, scale=INF), ValueError, "'scale' must be finite"),
    ("scale-nan", lambda: deepgemm.softmax(X, scale=NAN), ValueError, "'scale' must be finite"),
    ("columns-2^31", lambda: deepgemm.softmax(_huge((1, 2**31))), ValueError, "'x' has 2147483648 columns"),
    ("rows-2^31", lambda: deepgemm.softmax(_huge((2**16, 2**15, 1))), ValueError, "'x' has 2147483648 rows"),
]

SOFTMAX_BACKWARD_RULES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("y-int", lambda: torch.ops.deepgemm.softmax_backward(torch.ones(3, dtype=torch.int64), torch.ones(3), 1.0),
     TypeError, "'y' must have dtype"),
    ("dy-dtype", lambda: torch.ops.deepgemm.softmax_backward(X, X.half(), 1.0), TypeError, "'dy' must have y's dtype"),
    ("dy-shape", lambda: torch.ops.deepgemm.softmax_backward(X, X.t(), 1.0), ValueError, "'dy' must have y's shape"),
    ("y-0d", lambda: torch.ops.deepgemm.softmax_backward(torch.tensor(1.0), torch.tensor(1.0), 1.0), ValueError,
     "'y' must have at least 1 dimension"),
    ("dy-device", lambda: torch.ops.deepgemm.softmax_backward(X, X.to("meta"), 1.0), ValueError, "'dy' is on meta"),
    ("scale-nan", lambda: torch.ops.deepgemm.softmax_backward(X, X, NAN), ValueError, "'scale' must be finite"),
]

ROPE_RULES: list[tuple[str, dict[str, object], type[Exception], str]] = [
    ("q-list", {"q": [[1.0]]}, TypeError, "'q' must be a torch.Tensor"),
    ("q-int", {"q": torch.ones(4, 2, 8, dtype=torch.int32)}, TypeError, "'q' must have dtype"),
    ("q-2d", {"q": torch.randn(4, 16)}, ValueError, "'q' must be 3-D"),
    ("k-str", {"k": "k"}, TypeError, "'k' must be a torch.Tensor"),
    ("k-dtype", {"k": torch.randn(4, 1, 8).half()}, TypeError, "'k' must have q's dtype"),
    ("k-4d", {"k": torch.randn(4, 1, 1, 8)}, ValueError, "'k' must be 3-D"),
    ("k-tokens", {"k": torch.randn(5, 1, 8)}, ValueError, "'k' must hold q's 4 tokens"),
    ("cache-int", {"cos_sin_cache": torch.ones(10, 8, dtype=torch.int64)}, TypeError, "'cos_sin_cache' must have"),
    ("cache-1d", {"cos_sin_cache": torch.randn(8)}, ValueError, "'cos_sin_cache' must be 2-D"),
    ("cache-odd", {"cos_sin_cache": torch.randn(10, 7)}, ValueError, "'cos_sin_cache' must be .* even rotary_dim"),
    ("cache-empty-rotary", {"cos_sin_cache": torch.randn(10, 0)}, ValueError, "'cos_sin_cache' must be"),
    ("rotary-past-q", {"q": torch.randn(4, 2, 6)}, ValueError, "rotary_dim 8 .* exceeds q's head_dim 6"),
    ("rotary-past-k", {"k": torch.randn(4, 1, 4)}, ValueError, "rotary_dim 8 .* exceeds k's head_dim 4"),
    ("positions-float", {"positions": torch.arange(4.0)}, TypeError, "'positions' must have dtype"),
    ("positions-int16", {"positions": torch.arange(4, dtype=torch.int16)}, TypeError, "'positions' must have"),
    ("positions-list", {"positions": [0, 1, 2, 3]}, TypeError, "'positions' must be a torch.Tensor"),
    ("positions-2d", {"positions": torch.arange(4).view(4, 1)}, ValueError, "'positions' must be 1-D"),
    ("positions-count", {"positions": torch.arange(3)}, ValueError, "'positions' must hold one position per token"),
    ("interleaved-int", {"interleaved": 1}, TypeError, "'interleaved' must be a bool"),
    ("interleaved-none", {"interleaved": None}, TypeError, "'interleaved' must be a bool"),
    ("positions-device", {"positions": torch.arange(4, device="meta")}, ValueError, "'positions' is on meta"),
    ("cache-device", {"cos_sin_cache": torch.randn(10, 8, device="meta")}, ValueError, "'cos_sin_cache' is on meta"),
    ("rows-2^31", {"q": _huge((2**31, 1, 8)), "k": None, "positions": _huge((2**31,), torch.int64)}, ValueError,
     r"tokens x heads \(2147483648\)"),
]


@pytest.mark.parametrize("name,call,error,match", SOFTMAX_RULES + SOFTMAX_BACKWARD_RULES,
                         ids=[r[0] for r in SOFTMAX_RULES] + ["backward-" + r[0] for r in SOFTMAX_BACKWARD_RULES])
def test_softmax_argument_rules(name: str, call: Callable[[], object], error: type[Exception], match: str) -> None:
    """Each softmax / softmax_backward rule raises its documented exception type naming the argument."""
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("in_place", [False, True], ids=["rope", "rope_"])
@pytest.mark.parametrize("name,changes,error,match", ROPE_RULES, ids=[r[0] for r in ROPE_RULES])
def test_rope_argument_rules(name: str, changes: dict[str, object], error: type[Exception], match: str,
                             in_place: bool) -> None:
    """Each rope / rope_ rule raises its documented exception type naming the argument and the function."""
    args = _rope_args(**changes)
    function = deepgemm.rope_ if in_place else deepgemm.rope
    where = "rope_" if in_place else "rope"
    with pytest.raises(error, match=f"^{where}: .*{match}"):
        function(args.pop("q"), args.pop("k"), args.pop("cos_sin_cache"), args.pop("positions"), **args)


def test_rope_in_place_rules() -> None:
    """rope_ writes q and k: a non-unit head_dim stride, a self-overlapping view, q and k at the same address, or an
    inference tensor outside inference mode is refused before anything is written."""
    cache, positions = torch.randn(10, 8), torch.arange(4)
    q = torch.randn(4, 2, 8)
    cases = {
        r"'q' must have a unit stride along head_dim": (torch.randn(4, 2, 16)[..., ::2], None),
        r"'k' must have a unit stride along head_dim": (q.clone(), torch.randn(4, 8, 2).transpose(1, 2)[:, :1]),
        r"'q' overlaps itself": (torch.randn(1, 2, 8).expand(4, 2, 8), None),
        r"'k' overlaps itself": (q.clone(), torch.randn(4, 1, 8).expand(4, 3, 8)),
        r"'q' and 'k' start at the same address": (q, q),
    }
    with torch.inference_mode():
        frozen = torch.randn(4, 2, 8)
    cases[r"'q' was created under torch.inference_mode\(\)"] = (frozen, None)
    for message, (q_arg, k_arg) in cases.items():
        snapshot = [t.clone() for t in (q_arg, k_arg) if t is not None]
        with pytest.raises(ValueError, match=f"^rope_: {message}"):
            deepgemm.rope_(q_arg, k_arg, cache, positions)
        assert all(same_bits(t, s) for t, s in zip([t for t in (q_arg, k_arg) if t is not None], snapshot))
    with torch.inference_mode():
        deepgemm.rope_(frozen, None, cache, positions)  # allowed inside the mode


def test_gradient_refusals() -> None:
    """rope_ records no graph: q or k requiring grad (grad mode on) raises NotDifferentiableError, as does a cache
    that requires grad on rope and rope_; with grad mode off they run."""
    cache, positions = torch.randn(10, 8), torch.arange(4)
    q, k = torch.randn(4, 2, 8), torch.randn(4, 1, 8)
    with pytest.raises(deepgemm.NotDifferentiableError, match="^rope_: 'q' requires grad.*deepgemm.rope"):
        deepgemm.rope_(q.clone().requires_grad_(), k, cache, positions)
    with pytest.raises(deepgemm.NotDifferentiableError, match="^rope_: 'k' requires grad"):
        deepgemm.rope_(q, k.clone().requires_grad_(), cache, positions)
    grad_cache = cache.clone().requires_grad_()
    for function in (deepgemm.rope, deepgemm.rope_):
        with pytest.raises(deepgemm.NotDifferentiableError, match="'cos_sin_cache' requires grad.*detach"):
            function(q, k, grad_cache, positions)
    with torch.no_grad():
        leaf = q.clone().requires_grad_()
        deepgemm.rope_(leaf, None, grad_cache, positions)
        deepgemm.rope(q, k, grad_cache, positions)


def test_cache_requiring_grad_is_refused_when_q_requires_grad_too() -> None:
    """deepgemm.rope documents NotDifferentiableError for a cache that requires grad while grad mode is on: that must
    hold whether or not q requires grad (else cache.grad silently stays None)."""
    cache = torch.randn(10, 8, requires_grad=True)
    with pytest.raises(deepgemm.NotDifferentiableError, match="'cos_sin_cache' requires grad"):
        deepgemm.rope(torch.randn(4, 2, 8, requires_grad=True), None, cache, torch.arange(4))


GRAD_PATH_RULES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("softmax-x-0d", lambda: deepgemm.softmax(torch.tensor(1.0, requires_grad=True)), ValueError, "'x'"),
    ("softmax-scale-bool", lambda: deepgemm.softmax(X.clone().requires_grad_(), scale=True), TypeError, "'scale'"),
    ("softmax-scale-inf", lambda: deepgemm.softmax(X.clone().requires_grad_(), scale=INF), ValueError, "'scale'"),
    ("rope-positions-float", lambda: deepgemm.rope(torch.randn(4, 2, 8, requires_grad=True), None,
                                                   torch.randn(10, 8), torch.arange(4.0)), TypeError, "'positions'"),
]
# Rules the custom op's schema would coerce or refuse first (a bool flag given 1 or None, a non-tensor k): the public
# functions check them before calling the op.
GRAD_PATH_GAPS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("softmax-causal-int", lambda: deepgemm.softmax(X.clone().requires_grad_(), causal=1), TypeError, "'causal'"),
    ("rope-interleaved-int", lambda: deepgemm.rope(torch.randn(4, 2, 8, requires_grad=True), None,
                                                   torch.randn(10, 8), torch.arange(4), interleaved=1),
     TypeError, "'interleaved'"),
    ("rope-interleaved-none", lambda: deepgemm.rope(torch.randn(4, 2, 8, requires_grad=True), None,
                                                    torch.randn(10, 8), torch.arange(4), interleaved=None),
     TypeError, "'interleaved'"),
    ("rope-k-str", lambda: deepgemm.rope(torch.randn(4, 2, 8, requires_grad=True), "k", torch.randn(10, 8),
                                         torch.arange(4)), TypeError, "'k'"),
]


@pytest.mark.parametrize("name,call,error,match", GRAD_PATH_RULES + GRAD_PATH_GAPS,
                         ids=[r[0] for r in GRAD_PATH_RULES + GRAD_PATH_GAPS])
def test_argument_rules_hold_on_the_differentiable_path(name: str, call: Callable[[], object],
                                                        error: type[Exception], match: str) -> None:
    """An input that requires grad takes the custom op (autograd) path: the eager rules must raise the same
    exception type naming the argument there too."""
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------------------------------------- torch.compile


def _attention_probs(x: torch.Tensor) -> torch.Tensor:
    return deepgemm.softmax(x * 2, scale=0.25, causal=True) * 3


def test_compiled_softmax_forward_and_backward_match_eager(seed: int) -> None:
    """torch.compile(fullgraph=True) (inductor) of code around deepgemm.softmax: one graph holding the custom op,
    the eager forward values and gradients bit for bit."""
    torch._dynamo.reset()
    x = torch.randn(2, 3, 6, 9, requires_grad=True)
    grad = torch.randn(2, 3, 6, 9)
    eager = _attention_probs(x)
    eager.backward(grad)
    eager_grad, x.grad = x.grad, None
    compiled = torch.compile(_attention_probs, fullgraph=True)(x)
    compiled.backward(grad)
    assert torch.equal(compiled, eager) and torch.equal(x.grad, eager_grad)
    recorder = GraphRecorder()
    with torch.no_grad():
        torch.compile(_attention_probs, fullgraph=True, backend=recorder)(x.detach())
    assert "deepgemm.softmax" in recorder.targets()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_rope_matches_eager(dtype: torch.dtype, seed: int) -> None:
    """torch.compile(fullgraph=True) of deepgemm.rope (with and without k, forward and backward) gives the eager
    results and gradients bit for bit, through a custom-op node."""
    torch._dynamo.reset()
    cache = rope_cache(32, 8, torch.float32)
    positions = torch.randint(0, 32, (5,), dtype=torch.int32)
    q = torch.randn(5, 4, 16).to(dtype).requires_grad_()
    k = torch.randn(5, 2, 16).to(dtype).requires_grad_()

    def both(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        q_out, k_out = deepgemm.rope(q, k, cache, positions, interleaved=True)
        return q_out.float().sum(dim=1) + k_out.float().square().sum(dim=1)

    def only_q(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return deepgemm.rope(q, None, cache, positions)

    eager = both(q, k)
    eager.sum().backward()
    grads = (q.grad, k.grad)
    q.grad = k.grad = None
    recorder = GraphRecorder()
    compiled = torch.compile(both, fullgraph=True, backend=recorder)(q, k)
    compiled.sum().backward()
    assert torch.equal(compiled, eager) and torch.equal(q.grad, grads[0]) and torch.equal(k.grad, grads[1])
    assert "deepgemm.rope" in recorder.targets()
    got_q, got_k = torch.compile(only_q, fullgraph=True)(q.detach())
    assert got_k is None and torch.equal(got_q, only_q(q.detach())[0])


def test_compiled_rope_in_place_without_k_matches_eager(seed: int) -> None:
    """torch.compile(fullgraph=True) of deepgemm.rope_(q, None, ...) mutates q as eager does."""
    torch._dynamo.reset()
    cache = rope_cache(16, 8, torch.float32)
    positions = torch.randint(0, 16, (7,))
    q = torch.randn(7, 2, 12)

    def rotate(q: torch.Tensor) -> None:
        deepgemm.rope_(q, None, cache, positions, interleaved=True)

    eager, compiled = q.clone(), q.clone()
    rotate(eager)
    torch.compile(rotate, fullgraph=True, backend="aot_eager")(compiled)
    assert torch.equal(compiled, eager) and not torch.equal(eager, q)


def test_compiled_rope_in_place_on_fused_qkv_matches_eager(seed: int) -> None:
    """torch.compile(fullgraph=True) of deepgemm.rope_ on q and k views of one qkv tensor mutates it as eager does."""
    torch._dynamo.reset()
    cache = rope_cache(16, 8, torch.float32)
    positions = torch.randint(0, 16, (7,))
    qkv = torch.randn(7, 4 * 8)

    def rotate(qkv: torch.Tensor) -> None:
        deepgemm.rope_(qkv[:, :16].view(7, 2, 8), qkv[:, 16:24].view(7, 1, 8), cache, positions)

    eager, compiled = qkv.clone(), qkv.clone()
    rotate(eager)
    torch.compile(rotate, fullgraph=True, backend="aot_eager")(compiled)
    assert torch.equal(compiled, eager)


# ---------------------------------------------------------------------------------------------- custom ops

NEW_OPS = ("softmax", "softmax_backward", "rope", "rope_")


def test_new_ops_are_registered_with_cpu_cuda_and_fake_kernels() -> None:
    for name in NEW_OPS:
        for key in ("CPU", "CUDA", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"deepgemm::{name}", key), f"{name} lacks {key}"


def _opcheck_cases(seed: int) -> list[tuple[str, tuple]]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 7, generator=gen)
    y = torch.softmax(x, dim=-1)
    cache = rope_cache(12, 8, torch.float32)
    positions = torch.randint(0, 12, (4,), generator=gen)
    q, k = torch.randn(4, 3, 8, generator=gen), torch.randn(4, 1, 10, generator=gen)
    return [
        ("softmax", (x, 0.5, True)),
        ("softmax", (x.to(torch.bfloat16), -1.0, False)),
        ("softmax", (x.clone().requires_grad_(), 2.0, True)),  # autograd registration checks
        ("softmax", (x.transpose(1, 2), 1.0, False)),
        ("softmax_backward", (y, torch.randn(2, 5, 7, generator=gen), 0.5)),
        ("softmax_backward", (y.half(), torch.randn(2, 5, 7, generator=gen).half(), 3.0)),
        ("rope", (q, k, cache, positions, False, False)),
        ("rope", (q, None, cache.to(torch.bfloat16), positions.int(), True, True)),
        ("rope", (q.clone().requires_grad_(), k.clone().requires_grad_(), cache, positions, True, False)),
        ("rope_", (q.clone(), None, cache, positions, True)),
    ]


@pytest.mark.parametrize("case", range(10))
def test_opcheck(case: int, seed: int) -> None:
    """torch.library.opcheck (schema, fake kernel, autograd registration, AOT dispatch) of the new custom ops."""
    name, args = _opcheck_cases(seed)[case]
    torch.library.opcheck(getattr(torch.ops.deepgemm, name).default, args)


def test_opcheck_rope_in_place_with_k(seed: int) -> None:
    """opcheck of rope_ with a k (its fake kernel must accept distinct q and k)."""
    q, k = torch.randn(4, 3, 8), torch.randn(4, 1, 8)
    torch.library.opcheck(torch.ops.deepgemm.rope_.default, (q, k, rope_cache(12, 8, torch.float32),
                                                              torch.arange(4), False))


def test_softmax_backward_output_is_contiguous_for_a_strided_y(seed: int) -> None:
    """softmax_backward returns a new contiguous tensor (its docstring; its fake kernel assumes so), whatever y's
    strides: opcheck compares the real and the fake strides."""
    y = torch.softmax(torch.randn(6, 5), dim=-1).t()
    dy = torch.randn(6, 5).t()
    assert torch.ops.deepgemm.softmax_backward(y, dy, 1.0).is_contiguous()
    torch.library.opcheck(torch.ops.deepgemm.softmax_backward.default, (y, dy, 1.0))
