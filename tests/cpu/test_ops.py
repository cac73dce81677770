"""torch.library custom ops on CPU: registration, opcheck, fake kernels, torch.compile(fullgraph) with dynamic M,
and the refusal of inputs that require grad on every path."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode

import deepgemm
from tests.helpers import GraphRecorder, assert_wrong_ranks_raise_typed, random_operands
from tests.op_cases import OP_NAMES, fp8_aware_allclose, op_cases


@pytest.fixture
def fp8_allclose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "allclose", fp8_aware_allclose(torch.allclose))


def test_every_op_is_registered_with_cpu_cuda_and_fake_kernels() -> None:
    for name in OP_NAMES:
        qualified = f"deepgemm::{name}"
        for key in ("CPU", "CUDA", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key), f"{name} lacks a {key} kernel"
    assert len(OP_NAMES) == 24


@pytest.mark.parametrize("name", OP_NAMES)
def test_opcheck(name: str, seed: int, fp8_allclose: None) -> None:
    args = op_cases("cpu", seed)[name]
    torch.library.opcheck(getattr(torch.ops.deepgemm, name).default, args)


def test_functional_ops_match_the_public_functions(seed: int) -> None:
    cases = op_cases("cpu", seed)
    a0, sfa, b0, sfb, *_ = cases["fp8_gemm_nt"]
    out = torch.ops.deepgemm.fp8_gemm_nt(a0, sfa, b0, sfb)
    assert out.dtype == torch.bfloat16 and out.shape == (100, 200)
    assert torch.equal(out, deepgemm.fp8_gemm_nt((a0, sfa), (b0, sfb)))
    target = torch.full((100, 200), float("nan"))
    assert torch.ops.deepgemm.fp8_gemm_nt_out(a0, sfa, b0, sfb, target) is None
    assert torch.equal(target, deepgemm.fp8_gemm_nt((a0, sfa), (b0, sfb), out_dtype=torch.float32))
    x = cases["quantize_per_token_group"][0]
    q, sf = torch.ops.deepgemm.quantize_per_token_group(x)
    q_ref, sf_ref = deepgemm.quantize_per_token_group(x)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(sf, sf_ref)
    assert sf.stride() == sf_ref.stride() == (1, 100)
    *ka, ks, c = cases["k_grouped_fp8_gemm_tn_contiguous"]
    acc = c.clone()
    torch.ops.deepgemm.k_grouped_fp8_gemm_tn_contiguous_accumulate(*ka, ks, acc)
    assert torch.equal(acc, torch.ops.deepgemm.k_grouped_fp8_gemm_tn_contiguous(*ka, ks, c))


@pytest.mark.parametrize("name", OP_NAMES)
def test_fake_kernels_give_the_real_shapes_strides_and_dtypes(name: str, seed: int) -> None:
    args = op_cases("cpu", seed)[name]
    op = getattr(torch.ops.deepgemm, name).default
    real = op(*args) if not name.endswith(("_out", "_accumulate")) else None
    mode = FakeTensorMode()
    fake_args = tuple(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in args)
    with mode:
        fake = op(*fake_args)
    if real is None:
        assert fake is None
        return
    reals = real if isinstance(real, tuple) else (real,)
    fakes = fake if isinstance(fake, tuple) else (fake,)
    for r, f in zip(reals, fakes, strict=True):
        assert (tuple(f.shape), f.stride(), f.dtype) == (tuple(r.shape), r.stride(), r.dtype)


def test_fake_kernels_apply_the_argument_rules() -> None:
    mode = FakeTensorMode()
    with mode:
        a = torch.empty(64, 256, dtype=torch.float8_e4m3fn)
        sfa = torch.empty(64, 2)
        b = torch.empty(128, 384, dtype=torch.float8_e4m3fn)
        sfb = torch.empty(1, 3)
        with pytest.raises(ValueError, match="K must match"):
            torch.ops.deepgemm.fp8_gemm_nt(a, sfa, b, sfb)
        with pytest.raises(ValueError, match="'group_size'"):
            torch.ops.deepgemm.quantize_per_token_group(torch.empty(4, 256), 100)
        x = torch.empty(64, 64, dtype=torch.bfloat16)
        for layout in ("xx", "ntx", "q"):  # the fake kernel traced 'xx' as 'tt' and indexed 'q' out of range
            with pytest.raises(ValueError, match="'layout'"):
                torch.ops.deepgemm.bf16_gemm(x, x, layout)


@pytest.mark.parametrize("name", OP_NAMES)
def test_wrong_ranks_raise_the_public_errors(name: str, seed: int) -> None:
    """A functional op computes its output's shape from its operands: a wrong rank used to raise IndexError there
    (real and fake kernel) before the checks ran."""
    op = getattr(torch.ops.deepgemm, name).default
    assert assert_wrong_ranks_raise_typed(op, op_cases("cpu", seed)[name]) > 0


def _quantize_gemm_silu(x: torch.Tensor, w: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(x), (w, sw)))




def test_fullgraph_compile_with_dynamic_m_holds_deepgemm_nodes(seed: int) -> None:
    torch._dynamo.reset()
    _, (w, sw) = random_operands(1, 512, 384, "cpu", seed)
    recorder = GraphRecorder()
    compiled = torch.compile(_quantize_gemm_silu, fullgraph=True, dynamic=True, backend=recorder)
    gen = torch.Generator().manual_seed(seed)
    for m in (37, 300, 1000):  # (sizes 0 and 1 are always specialized by Dynamo)
        x = torch.randn(m, 384, generator=gen).to(torch.bfloat16)
        assert torch.equal(compiled(x, w, sw), _quantize_gemm_silu(x, w, sw))
    assert len(recorder.graphs) == 1, "a new M recompiled"
    targets = recorder.targets()
    assert {"deepgemm.quantize_per_token_group", "deepgemm.fp8_gemm_nt"} <= targets, targets
    # Our host code (the reference path's dequantize + matmul) must not have been traced into the graph.
    assert not any("matmul" in t or "repeat_interleave" in t for t in targets), targets


def test_mark_dynamic_and_aot_eager_match_eager(seed: int) -> None:
    torch._dynamo.reset()
    _, (w, sw) = random_operands(1, 200, 256, "cpu", seed)
    compiled = torch.compile(_quantize_gemm_silu, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(seed)
    for m in (5, 77):
        x = torch.randn(m, 256, generator=gen).to(torch.bfloat16)
        torch._dynamo.mark_dynamic(x, 0)
        assert torch.equal(compiled(x, w, sw), _quantize_gemm_silu(x, w, sw))
    explained = torch._dynamo.explain(_quantize_gemm_silu)(x, w, sw)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_inductor_compiles_the_ops_on_cpu(seed: int) -> None:
    torch._dynamo.reset()
    _, (w, sw) = random_operands(1, 256, 256, "cpu", seed)
    x = torch.randn(48, 256, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    compiled = torch.compile(_quantize_gemm_silu, fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x, w, sw), _quantize_gemm_silu(x, w, sw))


def test_grouped_and_k_grouped_compile_with_out_and_accumulate(seed: int) -> None:
    torch._dynamo.reset()
    cases = op_cases("cpu", seed)

    def moe(ag: tuple, bg: tuple, m_indices: torch.Tensor, out: torch.Tensor,
            am: tuple, masked_m: torch.Tensor, masked_out: torch.Tensor,
            ka: tuple, kb: tuple, acc: torch.Tensor) -> torch.Tensor:
        deepgemm.m_grouped_fp8_gemm_nt_contiguous(ag, bg, out, m_indices)
        deepgemm.m_grouped_fp8_gemm_nt_masked(am, bg, masked_out, masked_m, 100)
        deepgemm.k_grouped_fp8_gemm_tn_contiguous(ka, kb, acc, [128, 0, 256], c=acc)
        return out.sum() + masked_out.float().sum() + acc.sum()

    a0, sfa, b0, sfb, m_indices, _ = cases["m_grouped_fp8_gemm_nt_contiguous"]
    am0, amsf, _, _, masked_m, _, _ = cases["m_grouped_fp8_gemm_nt_masked"]
    ka0, kasf, kb0, kbsf, _, c = cases["k_grouped_fp8_gemm_tn_contiguous"]

    def fresh() -> tuple:
        return ((a0, sfa), (b0, sfb), m_indices, torch.full((512, 136), float("nan"), dtype=torch.bfloat16),
                (am0, amsf), masked_m, torch.zeros(3, 128, 136, dtype=torch.bfloat16), (ka0, kasf), (kb0, kbsf),
                c.clone())

    eager_args, compiled_args = fresh(), fresh()
    recorder = GraphRecorder()
    expected = moe(*eager_args)
    got = torch.compile(moe, fullgraph=True, backend=recorder)(*compiled_args)
    assert torch.equal(got, expected)
    for index in (3, 6, 9):  # the mutated outputs
        assert torch.equal(compiled_args[index], eager_args[index])
    assert {"deepgemm.m_grouped_fp8_gemm_nt_contiguous_out", "deepgemm.m_grouped_fp8_gemm_nt_masked_out",
            "deepgemm.k_grouped_fp8_gemm_tn_contiguous_accumulate"} <= recorder.targets()


def test_traced_calls_keep_the_eager_type_rules(seed: int) -> None:
    """The traced branch of the public functions took ks through int(k) (128.9 ran as 128) and read a[0], a[1] of
    any tuple; they now raise the eager path's messages (inside Dynamo's exception)."""
    ka = deepgemm.quantize_per_token_group(torch.randn(16, 256))
    kb = deepgemm.quantize_per_token_group(torch.randn(24, 256))
    x, y = torch.randn(256, 16).to(torch.bfloat16), torch.randn(256, 24).to(torch.bfloat16)
    q, sf = deepgemm.quantize_per_token_group(torch.randn(32, 256))
    w = deepgemm.quantize_per_block(torch.randn(64, 256))
    calls = {
        r"'ks\[0\]' must be an int": lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(
            ka, kb, torch.zeros(2, 16, 24), [128.9, 128.0]),
        r"'ks\[1\]' must be an int, got bool": lambda: deepgemm.k_grouped_bf16_gemm_tn_contiguous(
            x, y, torch.zeros(2, 16, 24), [128, True]),
        "under torch.compile 'ks' must be a list": lambda: deepgemm.k_grouped_bf16_gemm_tn_contiguous(
            x, y, torch.zeros(2, 16, 24), torch.tensor([128, 128])),
        "'a' must be a \\(fp8 tensor": lambda: deepgemm.fp8_gemm_nt((q, sf, sf), w),
        "'b' must be a \\(fp8 tensor": lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(
            (q[:0], sf[:0]), [w[0][None]], torch.empty(0, 64, dtype=torch.bfloat16), torch.empty(0, dtype=torch.int32)),
    }
    for message, call in calls.items():
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message):
            torch.compile(call, fullgraph=True, backend="eager")()
    torch._dynamo.reset()
    got = torch.compile(lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(ka, kb, torch.zeros(2, 16, 24), (128, 128)),
                        fullgraph=True, backend="eager")()
    assert torch.equal(got, deepgemm.k_grouped_fp8_gemm_tn_contiguous(ka, kb, torch.zeros(2, 16, 24), [128, 128]))


def test_inputs_that_require_grad_are_refused_on_every_path(seed: int) -> None:
    a, b = random_operands(64, 128, 256, "cpu", seed)
    sfa = a[1].clone().requires_grad_()
    with pytest.raises(deepgemm.NotDifferentiableError, match="'a\\[1\\]' requires grad"):
        deepgemm.fp8_gemm_nt((a[0], sfa), b)
    with pytest.raises(deepgemm.NotDifferentiableError):
        torch.ops.deepgemm.fp8_gemm_nt(a[0], sfa, b[0], b[1])
    x = torch.randn(8, 256, requires_grad=True)
    with pytest.raises(deepgemm.NotDifferentiableError, match="'x' requires grad"):
        deepgemm.quantize_per_token_group(x)
    with pytest.raises(RuntimeError, match="'x' requires grad, but FP8 GEMMs and quantizers are not differentiable"):
        torch.compile(deepgemm.quantize_per_token_group, fullgraph=True, backend="aot_eager")(x)  # Dynamo wraps it
    with torch.no_grad():
        out = deepgemm.fp8_gemm_nt((a[0], sfa), b)
        assert not out.requires_grad
        deepgemm.quantize_per_token_group(x)
