"""BF16 GEMM on CPU (the reference path): numerics against float64 in every layout, with and without C (in place
too), the output dtype rule, empty sizes; the argument rules (the same on the kernel path, and from the fake
kernels); gradients against torch autograd on the float64 reference; torch.compile and opcheck of the custom ops."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode

import deepgemm
from deepgemm.api import bf16 as bf16_api
from deepgemm.reference import bf16_gemm_reference
from tests.helpers import GraphRecorder, no_launch, outcome

BF16, FP32 = torch.bfloat16, torch.float32
LAYOUTS = ("nt", "nn", "tn", "tt")
GEMMS = {layout: getattr(deepgemm, f"bf16_gemm_{layout}") for layout in LAYOUTS}


def stored_shapes(layout: str, m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """A as [M, K] (first letter n) or [K, M] (t); B as [N, K] (second letter t) or [K, N] (n)."""
    return ((m, k) if layout[0] == "n" else (k, m)), ((n, k) if layout[1] == "t" else (k, n))


def operands(layout: str, m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random BF16 operands in `layout`'s stored forms (from torch's global generator: the `seed` fixture)."""
    a_shape, b_shape = stored_shapes(layout, m, n, k)
    return torch.randn(a_shape).to(BF16), torch.randn(b_shape).to(BF16)


def reference(layout: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
    return bf16_gemm_reference(a, b, layout, c, torch.float64)


def assert_matches(out: torch.Tensor, layout: str, a: torch.Tensor, b: torch.Tensor,
                   c: torch.Tensor | None = None) -> None:
    """calc_diff < 1e-5 against float64, and every element within float32 summation error (2^-18 of the summed
    magnitudes: about 40x what CPU float32 matmuls show up to K = 4096) plus the output's rounding (half a BF16 ulp:
    2^-8 relative)."""
    ref = reference(layout, a, b, c)
    magnitude = bf16_gemm_reference(a.abs(), b.abs(), layout, None if c is None else c.abs(), torch.float64)
    got = out.double()
    assert torch.isfinite(got).all()
    rounding = 2.0**-8 if out.dtype == BF16 else 2.0**-23
    bound = magnitude * 2.0**-18 + ref.abs() * rounding + 1e-30
    worst = ((got - ref).abs() / bound).max().item() if ref.numel() else 0.0
    assert worst <= 1.0, f"an element is {worst:.2f}x past its bound"
    if ref.numel() and ref.abs().sum() > 0:
        assert deepgemm.calc_diff(got, ref) < 1e-5


def q(name: str) -> str:
    return re.escape(f"'{name}'")


# ---------------------------------------------------------------- numerics


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", [(1, 8, 8), (37, 200, 256), (72, 136, 72), (129, 64, 1000)])
def test_every_layout_matches_float64(layout: str, m: int, n: int, k: int, seed: int) -> None:
    if layout[0] == "t" and m % 8 and k > 1:
        m += 8 - m % 8  # A given as [K, M]: M is its rows' length (16-byte rows)
    a, b = operands(layout, m, n, k)
    out = GEMMS[layout](a, b)
    assert out.dtype == BF16 and out.shape == (m, n)
    assert_matches(out, layout, a, b)
    fp32 = GEMMS[layout](a, b, out_dtype=FP32)
    assert fp32.dtype == FP32
    assert_matches(fp32, layout, a, b)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("c_dtype", [BF16, FP32])
@pytest.mark.parametrize("out_dtype", [BF16, FP32])
def test_with_c_into_a_given_out(layout: str, c_dtype: torch.dtype, out_dtype: torch.dtype, seed: int) -> None:
    m, n, k = 40, 72, 136
    a, b = operands(layout, m, n, k)
    c = torch.randn(m, n).to(c_dtype)
    out = torch.full((m, n), float("nan"), dtype=out_dtype)
    assert GEMMS[layout](a, b, out, c=c) is out
    assert_matches(out, layout, a, b, c)
    new = GEMMS[layout](a, b, c=c, out_dtype=out_dtype)
    assert new.dtype == out_dtype and torch.equal(new, out)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_c_as_out_accumulates_in_place(layout: str, dtype: torch.dtype, seed: int) -> None:
    m, n, k = 24, 48, 64
    a, b = operands(layout, m, n, k)
    acc = torch.randn(m, n).to(dtype)
    before = acc.clone()
    pointer = acc.data_ptr()
    assert GEMMS[layout](a, b, acc, c=acc) is acc
    assert acc.data_ptr() == pointer
    assert_matches(acc, layout, a, b, before)
    # a strided accumulator (rows 16-byte apart) is updated in place, its padding untouched
    storage = torch.randn(m, n + 8).to(dtype)
    padding = storage[:, n:].clone()
    view = storage[:, :n]
    start = view.clone()
    GEMMS[layout](a, b, view, c=view)
    assert_matches(view, layout, a, b, start)
    assert torch.equal(storage[:, n:], padding)


def test_default_out_dtype_is_c_dtype_else_bf16(seed: int) -> None:
    a, b = operands("nt", 16, 24, 32)
    assert deepgemm.bf16_gemm_nt(a, b).dtype == BF16
    assert deepgemm.bf16_gemm_nt(a, b, c=torch.zeros(16, 24)).dtype == FP32
    assert deepgemm.bf16_gemm_nt(a, b, c=torch.zeros(16, 24, dtype=BF16)).dtype == BF16
    assert deepgemm.bf16_gemm_nt(a, b, c=torch.zeros(16, 24), out_dtype=BF16).dtype == BF16
    assert deepgemm.bf16_gemm_nt(a, b, c=torch.zeros(16, 24, dtype=BF16), out_dtype=FP32).dtype == FP32
    assert deepgemm.bf16_gemm_nt(a, b, torch.empty(16, 24), out_dtype=FP32).dtype == FP32  # agreeing is fine


@pytest.mark.parametrize("layout", LAYOUTS)
def test_k_zero_gives_c_or_zeros(layout: str, seed: int) -> None:
    a, b = operands(layout, 8, 16, 0)
    zeros = GEMMS[layout](a, b)
    assert zeros.shape == (8, 16) and torch.equal(zeros, torch.zeros(8, 16, dtype=BF16))
    c = torch.randn(8, 16)
    assert torch.equal(GEMMS[layout](a, b, c=c), c)
    out = torch.full((8, 16), float("nan"), dtype=BF16)
    GEMMS[layout](a, b, out, c=c)
    assert torch.equal(out, c.to(BF16))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_m_zero_and_n_zero(layout: str, seed: int) -> None:
    a, b = operands(layout, 0, 16, 32)
    assert GEMMS[layout](a, b).shape == (0, 16)
    assert GEMMS[layout](a, b, c=torch.empty(0, 16)).dtype == FP32
    a, b = operands(layout, 8, 0, 32)
    assert GEMMS[layout](a, b).shape == (8, 0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_views_with_16_byte_rows_are_read_in_place(layout: str, seed: int) -> None:
    """Operands narrowed out of wider buffers (rows 16-byte apart, not contiguous) are valid."""
    m, n, k = 16, 24, 40
    (ar, ac), (br, bc) = stored_shapes(layout, m, n, k)
    a = torch.randn(ar, ac + 8).to(BF16)[:, :ac]
    b = torch.randn(br, bc + 16).to(BF16)[:, :bc]
    assert not a.is_contiguous() and not b.is_contiguous()
    assert_matches(GEMMS[layout](a, b), layout, a, b)


# ---------------------------------------------------------------- argument rules






def on_both_paths(monkeypatch: pytest.MonkeyPatch, call: Callable[[], object]) -> tuple[object, object]:
    """(outcome on the reference path, outcome on the kernel path): the kernel path is CPU tensors routed to "sm90"
    with planning replaced by a failure, so only the checks (run before the path choice) can stop the call."""
    reference = outcome(call)
    with monkeypatch.context() as patch:
        patch.setattr(bf16_api, "backend_for", lambda *tensors, **kw: "sm90")
        patch.setattr(bf16_api, "tuned_bf16_config", no_launch)  # planning starts with the tuned lookup
        patch.setattr(bf16_api, "get_bf16_plan", no_launch)
        kernel = outcome(call)
    return reference, kernel


def offset_view(shape: tuple[int, int], byte_offset: int) -> torch.Tensor:
    """A contiguous BF16 tensor whose data pointer is `byte_offset` bytes past a 16-byte boundary: an even offset
    is a dtype view of a uint8 buffer (`.view`); an odd one (which .view refuses) sets a storage sliced in bytes."""
    nbytes = shape[0] * shape[1] * 2
    raw = torch.zeros(nbytes + 32, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % 16 + byte_offset
    if byte_offset % 2 == 0:
        t = raw[skip:skip + nbytes].view(BF16).view(shape)
    else:
        t = torch.empty(0, dtype=BF16).set_(raw.untyped_storage()[skip:], 0, shape, (shape[1], 1))
    assert t.data_ptr() % 16 == byte_offset
    return t


def _bad_cases() -> dict[str, tuple[Callable[[], object], type, str]]:
    """case -> (call, exception type, regex the message must match: it names the argument)."""
    a, b = operands("nt", 16, 24, 32)
    a_tn, b_tn = operands("tn", 16, 24, 32)
    shared = torch.zeros(16 * 32 + 16 * 24, dtype=BF16)
    nt = deepgemm.bf16_gemm_nt
    out_buffer = torch.zeros(17 * 24, dtype=BF16)
    fp32_buffer = torch.zeros(16 * 24)
    return {
        "a_not_a_tensor": (lambda: nt(a.tolist(), b), TypeError, q("a")),
        "a_fp32": (lambda: nt(a.float(), b), TypeError, q("a") + ".*bfloat16"),
        "b_fp16": (lambda: nt(a, b.half()), TypeError, q("b")),
        "a_fp8": (lambda: nt(a.to(torch.float8_e4m3fn), b), TypeError, q("a")),
        "c_fp16": (lambda: nt(a, b, c=torch.zeros(16, 24, dtype=torch.float16)), TypeError, q("c")),
        "out_fp16": (lambda: nt(a, b, torch.zeros(16, 24, dtype=torch.float16)), TypeError, q("out")),
        "out_dtype_fp16": (lambda: nt(a, b, out_dtype=torch.float16), TypeError, q("out_dtype")),
        "a_3d": (lambda: nt(a.view(1, 16, 32), b), ValueError, q("a") + ".*2-D"),
        "b_1d": (lambda: nt(a, b.view(-1)), ValueError, q("b") + ".*2-D"),
        "k_mismatch": (lambda: nt(a, b[:, :24]), ValueError, q("a") + ".*" + q("b") + ".*K must match"),
        "k_mismatch_nn": (lambda: deepgemm.bf16_gemm_nn(a, torch.zeros(24, 24, dtype=BF16)), ValueError,
                          "K must match"),
        "c_shape": (lambda: nt(a, b, c=torch.zeros(24, 16)), ValueError, q("c") + ".*shape"),
        "out_shape": (lambda: nt(a, b, torch.zeros(16, 32, dtype=BF16)), ValueError, q("out") + ".*shape"),
        "n_not_multiple_of_8_nt": (lambda: nt(a, torch.zeros(12, 32, dtype=BF16)), ValueError, "N=12.*multiple of 8"),
        "n_not_multiple_of_8_nn": (lambda: deepgemm.bf16_gemm_nn(a, torch.zeros(32, 20, dtype=BF16)), ValueError,
                                   "N=20.*multiple of 8"),
        # A given as [K, M] (tn, tt): its rows are M long; with more than one row, M % 8 == 0.
        "tn_m_12": (lambda: deepgemm.bf16_gemm_tn(torch.zeros(32, 12, dtype=BF16), b_tn), ValueError,
                    q("a") + ".*row stride.*16 bytes"),
        "tt_m_12": (lambda: deepgemm.bf16_gemm_tt(torch.zeros(32, 12, dtype=BF16), b), ValueError,
                    q("a") + ".*row stride"),
        # K contiguous (A [M, K] of nt/nn, B [N, K] of nt/tt): K % 8 == 0.
        "nt_k_12_a": (lambda: nt(torch.zeros(16, 12, dtype=BF16), torch.zeros(8, 12, dtype=BF16)), ValueError,
                      q("a") + ".*row stride"),
        "nt_k_12_b": (lambda: nt(torch.zeros(1, 12, dtype=BF16), torch.zeros(8, 12, dtype=BF16)), ValueError,
                      q("b") + ".*row stride"),
        "nn_k_12": (lambda: deepgemm.bf16_gemm_nn(torch.zeros(16, 12, dtype=BF16), torch.zeros(12, 8, dtype=BF16)),
                    ValueError, q("a") + ".*row stride"),
        "tt_k_12_b": (lambda: deepgemm.bf16_gemm_tt(torch.zeros(12, 8, dtype=BF16), torch.zeros(8, 12, dtype=BF16)),
                      ValueError, q("b") + ".*row stride"),
        "out_rows_misaligned": (lambda: nt(a, b, torch.zeros(16, 28, dtype=BF16)[:, :24]), ValueError,
                                q("out") + ".*row stride"),
        "c_rows_misaligned": (lambda: nt(a, b, c=torch.zeros(16, 25)[:, :24]), ValueError, q("c") + ".*row stride"),
        "a_not_unit_stride": (lambda: nt(torch.zeros(32, 16, dtype=BF16).t(), b), ValueError,
                              q("a") + ".*unit stride"),
        "b_every_other_column": (lambda: nt(a, torch.zeros(24, 64, dtype=BF16)[:, ::2]), ValueError,
                                 q("b") + ".*unit stride"),
        "a_base_1_byte_off": (lambda: nt(offset_view((16, 32), 1), b), ValueError, q("a") + ".*16-byte aligned"),
        "b_base_2_bytes_off": (lambda: nt(a, offset_view((24, 32), 2)), ValueError, q("b") + ".*16-byte aligned"),
        "out_base_8_bytes_off": (lambda: nt(a, b, offset_view((16, 24), 8)), ValueError,
                                 q("out") + ".*16-byte aligned"),
        "c_base_4_bytes_off": (lambda: nt(a, b, c=offset_view((16, 24), 4)), ValueError, q("c") + ".*16-byte aligned"),
        "out_overlaps_a": (lambda: nt(shared[:16 * 32].view(16, 32), b, shared[16 * 32 - 64:16 * 32 - 64 + 384]
                                      .view(16, 24)), ValueError, q("out") + ".*overlaps.*" + q("a")),
        "out_is_b": (lambda: deepgemm.bf16_gemm_tn(torch.zeros(24, 24, dtype=BF16), b.view(24, 32)[:, :24],
                                                   b.view(24, 32)[:, :24]), ValueError,
                     q("out") + ".*overlaps.*" + q("b")),
        "c_overlaps_out_shifted": (lambda: nt(a, b, out_buffer[:384].view(16, 24), c=out_buffer[24:].view(16, 24)),
                                   ValueError, q("out") + ".*overlaps.*" + q("c")),
        "c_same_memory_other_dtype": (lambda: nt(a, b, fp32_buffer.view(BF16)[:384].view(16, 24),
                                                 c=fp32_buffer.view(16, 24)), ValueError,
                                      q("out") + ".*overlaps.*" + q("c")),
        "out_overlaps_itself": (lambda: nt(a, b, torch.zeros(1, 24, dtype=BF16).expand(16, 24)), ValueError,
                                q("out") + ".*overlaps itself"),
        "out_dtype_disagrees": (lambda: nt(a, b, torch.zeros(16, 24, dtype=BF16), out_dtype=FP32), ValueError,
                                q("out_dtype") + ".*" + q("out")),
        "b_on_meta": (lambda: nt(a, torch.empty(24, 32, dtype=BF16, device="meta")), ValueError,
                      q("b") + ".*meta.*" + q("a")),
        "c_on_meta": (lambda: nt(a, b, c=torch.empty(16, 24, device="meta")), ValueError, q("c") + ".*meta"),
        "out_on_meta": (lambda: nt(a, b, torch.empty(16, 24, dtype=BF16, device="meta")), ValueError,
                        q("out") + ".*meta"),
    }


BAD_CASES = sorted(_bad_cases())


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_arguments_raise_naming_the_argument_on_both_paths(case: str, seed: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    call, error, pattern = _bad_cases()[case]
    reference, kernel = on_both_paths(monkeypatch, call)
    assert reference is not None, "the reference path accepted a call the kernel path cannot take"
    assert reference[0] is error and re.search(pattern, reference[1]), reference
    assert kernel == reference, "the kernel path raised something else than the reference path"


def test_valid_calls_reach_the_kernel_path_after_the_checks(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the kernel takes is accepted on both paths, and reaches planning on the kernel path: odd M in nt/nn, a
    one-row A given as [1, M] (tn with K = 1) of any M, C as out."""
    a, b = operands("nt", 37, 24, 40)
    acc = torch.zeros(37, 24)
    calls = [
        lambda: deepgemm.bf16_gemm_nt(a, b),
        lambda: deepgemm.bf16_gemm_nn(a, torch.zeros(40, 24, dtype=BF16), out_dtype=FP32),
        lambda: deepgemm.bf16_gemm_tn(torch.zeros(1, 13, dtype=BF16), torch.zeros(1, 8, dtype=BF16)),
        lambda: deepgemm.bf16_gemm_nt(a, b, acc, c=acc),
    ]
    for call in calls:
        reference, kernel = on_both_paths(monkeypatch, call)
        assert reference is None
        assert kernel is not None and kernel[0] is AssertionError and "planning" in kernel[1]


def test_api_layout_is_checked() -> None:
    a, b = operands("nt", 8, 8, 8)
    with pytest.raises(ValueError, match="'layout'"):
        bf16_api.bf16_gemm("tx", a, b)


def _fake_cases() -> dict[str, tuple]:
    """case -> (layout, a, b, out_dtype): calls the metadata rules refuse."""
    a, b = operands("nt", 16, 24, 32)
    return {
        "k_mismatch": ("nt", a, b[:, :24], None),
        "n_not_multiple_of_8": ("nt", a, torch.zeros(12, 32, dtype=BF16), None),
        "tn_m_12": ("tn", torch.zeros(32, 12, dtype=BF16), torch.zeros(32, 24, dtype=BF16), None),
        "nt_k_12_b": ("nt", torch.zeros(1, 12, dtype=BF16), torch.zeros(8, 12, dtype=BF16), None),
        "a_fp32": ("nt", a.float(), b, None),
        "out_dtype_fp16": ("nt", a, b, torch.float16),
        "a_not_unit_stride": ("nt", torch.zeros(32, 16, dtype=BF16).t(), b, None),
    }


@pytest.mark.parametrize("case", sorted(_fake_cases()))
def test_fake_kernels_apply_the_metadata_rules(case: str, seed: int) -> None:
    """The custom op's fake kernel (tracing, no data) raises what the eager call raises."""
    layout, a, b, out_dtype = _fake_cases()[case]
    eager = outcome(lambda: GEMMS[layout](a, b, out_dtype=out_dtype))
    assert eager is not None and eager[0] in (TypeError, ValueError)
    mode = FakeTensorMode()
    fake_a, fake_b = mode.from_tensor(a), mode.from_tensor(b)
    with mode:
        fake = outcome(lambda: torch.ops.deepgemm.bf16_gemm(fake_a, fake_b, layout, None, out_dtype))
    assert fake == eager


# ---------------------------------------------------------------- autograd


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("c_dtype", [None, BF16, FP32])
def test_gradients_match_autograd_on_the_float64_reference(layout: str, c_dtype: torch.dtype | None,
                                                           seed: int) -> None:
    m, n, k = (37 if layout[0] == "n" else 40), 48, 72
    a, b = operands(layout, m, n, k)
    a.requires_grad_()
    b.requires_grad_()
    c = None if c_dtype is None else torch.randn(m, n).to(c_dtype).requires_grad_()
    out = GEMMS[layout](a, b, c=c)
    assert out.requires_grad and out.dtype == (c_dtype or BF16)
    grad = torch.randn(m, n).to(out.dtype)
    out.backward(grad)
    ref_a, ref_b = (t.detach().double().requires_grad_() for t in (a, b))
    ref_c = None if c is None else c.detach().double().requires_grad_()
    reference(layout, ref_a, ref_b, ref_c).backward(grad.to(BF16).double())  # the backward reads dD in BF16
    for got, want in ((a.grad, ref_a.grad), (b.grad, ref_b.grad)):
        assert got is not None and got.dtype == BF16 and got.shape == want.shape
        assert deepgemm.calc_diff(got.double(), want) < 1e-5
        assert torch.allclose(got.double(), want, rtol=2**-7, atol=2**-7 * want.abs().max().item())
    if c is not None:
        assert c.grad is not None and c.grad.dtype == c_dtype
        assert torch.equal(c.grad, grad.to(c_dtype))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_of_one_input_only(layout: str, seed: int) -> None:
    a, b = operands(layout, 16, 24, 32)
    b.requires_grad_()
    GEMMS[layout](a, b).float().sum().backward()
    ref_b = b.detach().double().requires_grad_()
    reference(layout, a, ref_b).sum().backward()
    assert a.grad is None and deepgemm.calc_diff(b.grad.double(), ref_b.grad) < 1e-5


def test_out_with_inputs_that_require_grad_is_refused(seed: int) -> None:
    a, b = operands("nt", 16, 24, 32)
    x = a.clone().requires_grad_()
    out = torch.empty(16, 24, dtype=BF16)
    with pytest.raises(deepgemm.NotDifferentiableError, match=q("a") + " requires grad"):
        deepgemm.bf16_gemm_nt(x, b, out)
    acc = torch.zeros(16, 24, requires_grad=True)
    with pytest.raises(deepgemm.NotDifferentiableError, match=q("c")):
        deepgemm.bf16_gemm_nt(a, b, torch.empty(16, 24), c=acc)
    with pytest.raises(deepgemm.NotDifferentiableError):
        deepgemm.bf16_gemm_nt(a, b, acc, c=acc)  # the in-place form
    with pytest.raises(deepgemm.NotDifferentiableError):
        bf16_api.bf16_gemm("nt", x, b)  # the raw implementation has no backward either
    with pytest.raises(deepgemm.NotDifferentiableError):
        torch.ops.deepgemm.bf16_gemm_out(x, b, "nt", None, out)
    with torch.no_grad():
        deepgemm.bf16_gemm_nt(x, b, out)
        deepgemm.bf16_gemm_nt(a, b, acc, c=acc)
    assert_matches(out, "nt", a, b)


# ---------------------------------------------------------------- torch.compile and the custom ops




def _gemm_relu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(deepgemm.bf16_gemm_nt(x, w))


def test_fullgraph_compile_with_dynamic_m_holds_a_bf16_gemm_node(seed: int) -> None:
    torch._dynamo.reset()
    w = torch.randn(136, 256).to(BF16)
    recorder = GraphRecorder()
    compiled = torch.compile(_gemm_relu, fullgraph=True, dynamic=True, backend=recorder)
    for m in (37, 300, 1000):  # (sizes 0 and 1 are always specialized by Dynamo)
        x = torch.randn(m, 256).to(BF16)
        assert torch.equal(compiled(x, w), _gemm_relu(x, w))
    assert len(recorder.graphs) == 1, "a new M recompiled"
    targets = recorder.targets()
    assert "deepgemm.bf16_gemm" in targets, targets
    assert not any("matmul" in t or t.endswith(".mm") for t in targets), targets  # the reference path is not traced
    explained = torch._dynamo.explain(_gemm_relu)(x, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_compiled_forms_with_out_accumulate_and_backward(seed: int) -> None:
    """torch.compile(aot_eager) of the out= and in-place forms, and of a training step: same values and gradients
    as eager."""
    torch._dynamo.reset()

    def step(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        deepgemm.bf16_gemm_tn(x, w, out)
        deepgemm.bf16_gemm_tn(x, w, acc, c=acc)
        return out.float().sum() + acc.sum()

    x, w = operands("tn", 16, 24, 40)
    args = [(x, w, torch.empty(16, 24, dtype=BF16), torch.ones(16, 24)) for _ in range(2)]
    recorder = GraphRecorder()
    expected = step(*args[0])
    got = torch.compile(step, fullgraph=True, backend=recorder)(*args[1])
    assert torch.equal(got, expected)
    assert torch.equal(args[0][2], args[1][2]) and torch.equal(args[0][3], args[1][3])
    assert {"deepgemm.bf16_gemm_out", "deepgemm.bf16_gemm_accumulate"} <= recorder.targets()

    torch._dynamo.reset()

    def loss(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.relu(deepgemm.bf16_gemm_nn(a, b, c=c)).sum()

    a, b = operands("nn", 24, 32, 48)
    c = torch.randn(24, 32)
    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True, backend="aot_eager")):
        inputs = [t.clone().requires_grad_() for t in (a, b, c)]
        fn(*inputs).backward()
        grads.append([t.grad for t in inputs])
    for eager_grad, compiled_grad in zip(*grads, strict=True):
        assert torch.equal(eager_grad, compiled_grad)


def _op_cases() -> dict[str, tuple]:
    """Each layout once per op family member, with C absent, BF16 and FP32, and both output dtypes."""
    a = {layout: operands(layout, 40, 72, 136) for layout in LAYOUTS}
    return {
        "bf16_gemm-nt": ("bf16_gemm", (*a["nt"], "nt", None, None)),
        "bf16_gemm-nn-fp32-out": ("bf16_gemm", (*a["nn"], "nn", None, FP32)),
        "bf16_gemm-tn-c-bf16": ("bf16_gemm", (*a["tn"], "tn", torch.randn(40, 72).to(BF16), None)),
        "bf16_gemm-tt-c-fp32": ("bf16_gemm", (*a["tt"], "tt", torch.randn(40, 72), BF16)),
        "bf16_gemm_out-nn": ("bf16_gemm_out", (*a["nn"], "nn", torch.randn(40, 72), torch.empty(40, 72, dtype=BF16))),
        "bf16_gemm_out-tt": ("bf16_gemm_out", (*a["tt"], "tt", None, torch.empty(40, 72))),
        "bf16_gemm_accumulate-nt": ("bf16_gemm_accumulate", (*a["nt"], "nt", torch.randn(40, 72))),
        "bf16_gemm_accumulate-tn": ("bf16_gemm_accumulate", (*a["tn"], "tn", torch.randn(40, 72).to(BF16))),
    }


@pytest.mark.parametrize("case", sorted(_op_cases()))
def test_opcheck_every_layout(case: str, seed: int) -> None:
    name, args = _op_cases()[case]
    torch.library.opcheck(getattr(torch.ops.deepgemm, name).default, args)


@pytest.mark.parametrize("layout", ["nn", "tt"])  # each operand in both stored forms
def test_opcheck_with_inputs_that_require_grad(layout: str, seed: int) -> None:
    """opcheck's autograd tests run the registered backward (through the ops, as AOT autograd traces it)."""
    a, b = operands(layout, 24, 48, 64)
    c = torch.randn(24, 48)
    args = (a.requires_grad_(), b.requires_grad_(), layout, c.requires_grad_(), None)
    torch.library.opcheck(torch.ops.deepgemm.bf16_gemm.default, args)


# ---------------------------------------------------------------- review findings


@pytest.mark.parametrize("layout,m", [("nt", 1), ("nt", 7), ("nt", 9), ("nn", 7), ("tn", 8), ("tt", 8)])
@pytest.mark.parametrize("reduce", ["sum", "sum0"])
def test_backward_of_broadcast_gradients(layout: str, m: int, reduce: str, seed: int) -> None:
    """`y.sum()` hands back a stride-(0, 0) gradient and `y.sum(0)` a stride-(0, 1) one; with M % 8 != 0 a naive
    copy of the transposed gradient has rows that break the 16-byte rule (this raised ValueError before)."""
    n, k = 8, 8
    a = torch.randn((m, k) if layout[0] == "n" else (k, m)).to(torch.bfloat16).requires_grad_()
    b = torch.randn((n, k) if layout[1] == "t" else (k, n)).to(torch.bfloat16).requires_grad_()
    y = GEMMS[layout](a, b)
    (y.sum() if reduce == "sum" else y.sum(0).sum()).backward()
    ref_a, ref_b = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ref = bf16_gemm_reference(ref_a, ref_b, layout, None, torch.float64)
    (ref.sum() if reduce == "sum" else ref.sum(0).sum()).backward()
    for got, want in ((a.grad, ref_a.grad), (b.grad, ref_b.grad)):
        assert got.shape == want.shape
        assert torch.allclose(got.double(), want, rtol=2e-2, atol=2e-2)


def test_c_row_stride_past_32_bits_is_refused() -> None:
    """The kernel indexes C rows with a 32-bit stride: a wider one is refused, not wrapped (metadata only: meta
    tensors stand in for the 16 GB a real one needs)."""
    a = torch.empty(2, 64, dtype=torch.bfloat16, device="meta")
    b = torch.empty(8, 64, dtype=torch.bfloat16, device="meta")
    c = torch.empty_strided((2, 8), (2**32, 1), dtype=torch.float32, device="meta")
    with pytest.raises(ValueError, match="'c' row stride"):
        bf16_api.check_bf16_gemm("nt", a, b, None, c, None)
    narrow = torch.empty_strided((2, 8), (2**32 - 8, 1), dtype=torch.float32, device="meta")
    bf16_api.check_bf16_gemm("nt", a, b, None, narrow, None)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_broadcast_operands_are_copied_once(layout: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows 0 bytes apart (an expanded row) are no TMA tensor: the operand reaches the kernel path as a contiguous
    copy (and the result matches float64)."""
    m, n, k = 16, 24, 32
    a_rows, b_rows = ((m, k) if layout[0] == "n" else (k, m)), ((n, k) if layout[1] == "t" else (k, n))
    a = torch.randn(1, a_rows[1]).to(BF16).expand(*a_rows)
    b = torch.randn(1, b_rows[1]).to(BF16).expand(*b_rows)
    assert_matches(GEMMS[layout](a, b), layout, a, b)
    seen: list[tuple[int, ...]] = []

    def record_plan(*args: object, **kwargs: object) -> object:
        raise AssertionError("planned")

    monkeypatch.setattr(bf16_api, "backend_for", lambda *tensors, **kw: (seen.append(tensors[0].stride()), "sm90")[1])
    monkeypatch.setattr(bf16_api, "tuned_bf16_config", record_plan)
    with pytest.raises(AssertionError, match="planned"):
        bf16_api.bf16_gemm(layout, a, b)
    assert seen and seen[0][0] != 0


def test_calls_without_out_launch_from_the_operand_key(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm call that allocates its output launches from a table keyed on the operands (FreshOutputs), not on the
    output's pointer: the checked path runs once per argument set however the allocator places the new output, each
    launch gets arguments packed for the output it returns, and another addend, out_dtype or layout is another entry."""
    checked: list[str] = []
    packed: list[int] = []
    launched: list[int] = []

    class Plan:
        def packed_args(self, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None) -> int:
            packed.append(d.data_ptr())
            return d.data_ptr()

        def launch_packed(self, args: int) -> None:
            launched.append(args)

    real_checked = bf16_api._bf16_gemm_checked

    def counted(layout: str, *args: object) -> torch.Tensor:
        checked.append(layout)
        return real_checked(layout, *args)

    monkeypatch.setattr(bf16_api, "_bf16_gemm_checked", counted)
    monkeypatch.setattr(bf16_api, "backend_for", lambda *tensors, **kw: "sm90")
    monkeypatch.setattr(bf16_api, "tuned_bf16_config", lambda *args: None)
    monkeypatch.setattr(bf16_api, "get_bf16_plan", lambda *args: Plan())
    monkeypatch.setattr(bf16_api, "_fresh", {})
    monkeypatch.setattr(bf16_api, "_ready", {})
    a, b = operands("nt", 16, 24, 32)
    c = torch.randn(16, 24)
    kept = [deepgemm.bf16_gemm_nt(a, b) for _ in range(5)]  # every output stays alive: five pointers
    kept += [deepgemm.bf16_gemm_nt(a, b) for _ in range(3)]
    assert checked == ["nt"]
    assert launched == [out.data_ptr() for out in kept] and len(set(launched)) == len(kept)
    assert all(out.shape == (16, 24) and out.dtype == BF16 for out in kept)
    # Outputs freed back to the allocator: a pointer seen before launches its stored arguments (nothing packed), a new
    # one packs once.
    kept.clear()
    for _ in range(4):
        seen, count = set(packed), len(packed)
        out = deepgemm.bf16_gemm_nt(a, b)
        assert launched[-1] == out.data_ptr() and len(packed) == count + (out.data_ptr() not in seen)
        del out
    for call in (lambda: deepgemm.bf16_gemm_nt(a, b, out_dtype=FP32), lambda: deepgemm.bf16_gemm_nt(a, b, c=c)):
        first, second = call(), call()
        assert first.dtype == second.dtype == FP32 and launched[-2:] == [first.data_ptr(), second.data_ptr()]
    assert checked == ["nt", "nt", "nt"] and len(launched) == 16
    deepgemm.bf16_gemm_tn(a.t().contiguous(), b.t().contiguous())
    assert checked[-1] == "tn"
    assert len(bf16_api._fresh) == 4 and set(packed) == set(launched)
    # The same operands, now requiring grad in grad mode, never take the table: the checked path refuses them here
    # (the public function differentiates such calls through the custom op instead).
    a.requires_grad_()
    with pytest.raises(deepgemm.NotDifferentiableError):
        bf16_api.bf16_gemm("nt", a, b)
    assert checked[-1] == "nt" and len(checked) == 5
