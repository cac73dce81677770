"""Bad arguments to fp8_gemm_nt and the quantizers raise the right exception, naming the argument."""

from __future__ import annotations

import re

import pytest
import torch

import deepgemm

FP8 = torch.float8_e4m3fn


def operands(m: int = 7, n: int = 200, k: int = 304):
    a = (torch.randn(m, k) * 10).to(FP8)
    b = (torch.randn(n, k) * 10).to(FP8)
    sfa = torch.rand(m, -(-k // 128)) + 0.5
    sfb = torch.rand(-(-n // 128), -(-k // 128)) + 0.5
    return (a, sfa), (b, sfb)


def q(name: str) -> str:
    """Regex for the argument name as the messages quote it: 'a[0]'."""
    return re.escape(f"'{name}'")


def test_valid_operands_work() -> None:
    """The baseline every other test in this file perturbs is itself accepted."""
    a, b = operands()
    out = deepgemm.fp8_gemm_nt(a, b)
    assert out.shape == (7, 200) and out.dtype == torch.bfloat16
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("bad", [None, "a", 3, (), lambda a: (a[0],), lambda a: (a[0], a[1], a[1])])
def test_a_not_a_pair(bad) -> None:
    a, b = operands()
    value = bad(a) if callable(bad) else bad
    with pytest.raises(TypeError, match=q("a")):
        deepgemm.fp8_gemm_nt(value, b)


def test_b_not_a_pair() -> None:
    a, b = operands()
    with pytest.raises(TypeError, match=q("b")):
        deepgemm.fp8_gemm_nt(a, b[0])
    with pytest.raises(TypeError, match=q("b")):
        deepgemm.fp8_gemm_nt(a, {"q": b[0], "sf": b[1]})


def test_pair_members_must_be_tensors() -> None:
    a, b = operands()
    with pytest.raises(TypeError, match=q("a[0]")):
        deepgemm.fp8_gemm_nt((a[0].tolist(), a[1]), b)
    with pytest.raises(TypeError, match=q("b[1]")):
        deepgemm.fp8_gemm_nt(a, (b[0], 1.0))


def test_a_list_pair_is_accepted() -> None:
    a, b = operands()
    out = deepgemm.fp8_gemm_nt(list(a), list(b), out_dtype=torch.float32)
    assert torch.equal(out, deepgemm.fp8_gemm_nt(a, b, out_dtype=torch.float32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8, torch.float8_e5m2, torch.int8])
def test_operand_dtype(dtype: torch.dtype) -> None:
    a, b = operands()
    with pytest.raises(TypeError, match=q("a[0]")):
        deepgemm.fp8_gemm_nt((a[0].float().to(dtype), a[1]), b)
    with pytest.raises(TypeError, match=q("b[0]")):
        deepgemm.fp8_gemm_nt(a, (b[0].float().to(dtype), b[1]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16, torch.int32])
def test_scale_dtype(dtype: torch.dtype) -> None:
    a, b = operands()
    with pytest.raises(TypeError, match=q("a[1]")):
        deepgemm.fp8_gemm_nt((a[0], a[1].to(dtype)), b)
    with pytest.raises(TypeError, match=q("b[1]")):
        deepgemm.fp8_gemm_nt(a, (b[0], b[1].to(dtype)))


def test_operand_rank() -> None:
    a, b = operands()
    with pytest.raises(ValueError, match=q("a[0]")):
        deepgemm.fp8_gemm_nt((a[0][0], a[1]), b)  # 1-D
    with pytest.raises(ValueError, match=q("a[0]")):
        deepgemm.fp8_gemm_nt((a[0].unsqueeze(0), a[1]), b)  # 3-D
    with pytest.raises(ValueError, match=q("b[0]")):
        deepgemm.fp8_gemm_nt(a, (b[0][0], b[1]))
    with pytest.raises(ValueError, match=q("b[0]")):
        deepgemm.fp8_gemm_nt(a, (b[0].unsqueeze(0), b[1]))


def test_k_mismatch() -> None:
    a, _ = operands(k=300)
    _, b = operands(k=256)
    with pytest.raises(ValueError, match="K") as info:
        deepgemm.fp8_gemm_nt(a, b)
    assert "300" in str(info.value) and "256" in str(info.value)


@pytest.mark.parametrize(
    "shape",
    [(7, 2), (7, 4), (6, 3), (8, 3), (3, 7), (7,), (1, 7, 3)],
)
def test_sfa_shape(shape) -> None:
    a, b = operands()  # M=7, K=300: sfa must be [7, 3]
    with pytest.raises(ValueError, match=q("a[1]")):
        deepgemm.fp8_gemm_nt((a[0], torch.ones(shape)), b)


@pytest.mark.parametrize("shape", [(2, 2), (1, 3), (3, 3), (3, 2), (200, 3), (6,), (2, 3, 1)])
def test_sfb_shape(shape) -> None:
    a, b = operands()  # N=200, K=300: sfb must be [2, 3]
    with pytest.raises(ValueError, match=q("b[1]")):
        deepgemm.fp8_gemm_nt(a, (b[0], torch.ones(shape)))


@pytest.mark.parametrize("shape", [(200, 7), (7, 199), (8, 200), (7, 200, 1), (1400,)])
def test_out_shape(shape) -> None:
    a, b = operands()
    with pytest.raises(ValueError, match=q("out")):
        deepgemm.fp8_gemm_nt(a, b, torch.empty(shape, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, FP8, torch.int32])
def test_out_dtype_of_out_tensor(dtype: torch.dtype) -> None:
    a, b = operands()
    with pytest.raises(TypeError, match=q("out")):
        deepgemm.fp8_gemm_nt(a, b, torch.zeros(7, 200).to(dtype))


def test_out_not_a_tensor() -> None:
    a, b = operands()
    with pytest.raises(TypeError, match=q("out")):
        deepgemm.fp8_gemm_nt(a, b, [[0.0] * 200] * 7)


def test_out_dtype_conflicts_with_out() -> None:
    a, b = operands()
    out = torch.empty(7, 200, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=q("out_dtype")):
        deepgemm.fp8_gemm_nt(a, b, out, out_dtype=torch.float32)
    out32 = torch.empty(7, 200, dtype=torch.float32)
    with pytest.raises(ValueError, match=q("out_dtype")):
        deepgemm.fp8_gemm_nt(a, b, out32, out_dtype=torch.bfloat16)
    # Agreeing values are fine.
    assert deepgemm.fp8_gemm_nt(a, b, out32, out_dtype=torch.float32) is out32


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, FP8, "bf16"])
def test_unsupported_out_dtype(dtype) -> None:
    a, b = operands()
    with pytest.raises(TypeError, match=q("out_dtype")):
        deepgemm.fp8_gemm_nt(a, b, out_dtype=dtype)


def test_devices_must_agree() -> None:
    """Tensors on different devices (here cpu and meta) are refused, naming the odd one out."""
    a, b = operands()
    with pytest.raises(ValueError, match=q("sfb")):
        deepgemm.fp8_gemm_nt(a, (b[0], b[1].to("meta")))
    with pytest.raises(ValueError, match=q("out")):
        deepgemm.fp8_gemm_nt(a, b, torch.empty(7, 200, dtype=torch.bfloat16, device="meta"))


def test_validation_runs_for_empty_shapes_too() -> None:
    """M=0 / K=0 short cuts must not skip the argument checks."""
    a, b = operands(m=0)
    with pytest.raises(TypeError, match=q("out_dtype")):
        deepgemm.fp8_gemm_nt(a, b, out_dtype=torch.float16)
    a, b = operands(k=0)
    with pytest.raises(ValueError, match=q("a[1]")):
        deepgemm.fp8_gemm_nt((a[0], torch.ones(7, 1)), b)


# ---------------------------------------------------------------- quantizers

QUANTIZERS = [
    (deepgemm.quantize_per_token_group, "x"),
    (deepgemm.quantize_per_block, "w"),
]


@pytest.mark.parametrize("fn,name", QUANTIZERS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.float64, FP8, torch.bool])
def test_quantize_input_dtype(fn, name: str, dtype: torch.dtype) -> None:
    x = torch.ones(4, 256).to(dtype)
    with pytest.raises(TypeError, match=q(name)):
        fn(x)


@pytest.mark.parametrize("fn,name", QUANTIZERS)
@pytest.mark.parametrize("shape", [(2, 4, 256), (256,), ()])
def test_quantize_input_rank(fn, name: str, shape) -> None:
    with pytest.raises(ValueError, match=q(name)):
        fn(torch.ones(shape))


@pytest.mark.parametrize("fn,name", QUANTIZERS)
def test_quantize_input_not_a_tensor(fn, name: str) -> None:
    with pytest.raises(TypeError, match=q(name)):
        fn([[1.0] * 256] * 4)
