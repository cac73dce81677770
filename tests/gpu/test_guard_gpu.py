"""The guard every GPU test runs under (tests/gpu/guard.py, the autouse `gpu_guard` fixture) bites: with the
reference path forced for CUDA tensors, each public entry point raises the guard's AssertionError and the guard
fails the test at teardown; on the kernel path nothing is refused and kernel launches are counted; direct
deepgemm.reference calls and CPU-tensor calls are left alone."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import deepgemm
from tests.gpu.checks import contiguous_layout, masked_operands, psum_of
from tests.gpu.guard import GEMM_ENTRY, QUANTIZE_ENTRY, GpuGuard
from tests.helpers import random_activations, random_grouped_weights, random_operands, reference_fp64

pytestmark = [pytest.mark.gpu, pytest.mark.quick]

Call = Callable[[], object]


def _dense() -> Call:
    a, b = random_operands(40, 264, 528, "cuda", seed=5)
    return lambda: deepgemm.fp8_gemm_nt(a, b)


def _fp8_linear() -> Call:
    from deepgemm.api.linear import fp8_linear

    x = torch.randn(40, 528, device="cuda", dtype=torch.bfloat16)
    w, s = deepgemm.quantize_per_block(torch.randn(264, 528, device="cuda"))
    return lambda: fp8_linear(x, w, s)


def _quantize_per_token_group() -> Call:
    x = torch.randn(40, 528, device="cuda", dtype=torch.bfloat16)
    return lambda: deepgemm.quantize_per_token_group(x)


def _silu_mul_quantize() -> Call:
    x = torch.randn(40, 2 * 528, device="cuda", dtype=torch.bfloat16)
    return lambda: deepgemm.silu_mul_quantize_per_token_group(x)


def _quantize_per_block() -> Call:
    w = torch.randn(264, 528, device="cuda", dtype=torch.bfloat16)
    return lambda: deepgemm.quantize_per_block(w)


def _contiguous_inputs():  # noqa: ANN202
    counts = [100, 28]
    m_indices = contiguous_layout(counts)
    a = random_activations(m_indices.numel(), 512, "cuda", 1)
    b = random_grouped_weights(2, 264, 512, "cuda", 2)
    out = torch.empty(m_indices.numel(), 264, dtype=torch.bfloat16, device="cuda")
    return a, b, out, m_indices.cuda(), psum_of(counts).cuda()


def _contiguous() -> Call:
    a, b, out, m_indices, _ = _contiguous_inputs()
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices)


def _contiguous_psum() -> Call:
    a, b, out, _, psum = _contiguous_inputs()
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, psum)


def _masked() -> Call:
    a, b = masked_operands(2, 64, 264, 512, seed=3)
    out = torch.empty(2, 64, 264, dtype=torch.bfloat16, device="cuda")
    masked_m = torch.tensor([10, 64], dtype=torch.int32, device="cuda")
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, 32)


def _k_grouped() -> Call:
    gen = torch.Generator().manual_seed(4)
    a = deepgemm.quantize_per_token_group(torch.randn(128, 256, generator=gen).to("cuda", torch.bfloat16))
    b = deepgemm.quantize_per_token_group(torch.randn(136, 256, generator=gen).to("cuda", torch.bfloat16))
    out = torch.empty(2, 128, 136, device="cuda")
    return lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, [128, 128])


CALLS: dict[str, tuple[Callable[[], Call], str]] = {  # name -> (builder, entry prefix of the kernel it launches)
    "fp8_gemm_nt": (_dense, GEMM_ENTRY),
    "fp8_linear": (_fp8_linear, GEMM_ENTRY),
    "quantize_per_token_group": (_quantize_per_token_group, QUANTIZE_ENTRY),
    "quantize_per_block": (_quantize_per_block, QUANTIZE_ENTRY),
    "silu_mul_quantize_per_token_group": (_silu_mul_quantize, QUANTIZE_ENTRY),
    "m_grouped_fp8_gemm_nt_contiguous": (_contiguous, GEMM_ENTRY),
    "m_grouped_fp8_gemm_nt_contiguous_psum": (_contiguous_psum, GEMM_ENTRY),
    "m_grouped_fp8_gemm_nt_masked": (_masked, GEMM_ENTRY),
    "k_grouped_fp8_gemm_tn_contiguous": (_k_grouped, GEMM_ENTRY),
}


def _no_warm_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty launch-ready tables: a call can only go through the checked path (where the path is chosen)."""
    import deepgemm.api.bf16 as api_bf16
    import deepgemm.api.bf16_grouped as api_bf16_grouped
    import deepgemm.api.gemm as api_gemm
    import deepgemm.api.grouped as api_grouped
    import deepgemm.api.linear as api_linear
    import deepgemm.api.quant as api_quant

    # (no raising=False: a renamed table must fail here, not stay warm and skip the path choice)
    monkeypatch.setattr(api_gemm, "_ready", {})
    monkeypatch.setattr(api_gemm, "_fresh", {})
    monkeypatch.setattr(api_grouped, "_ready", {})
    monkeypatch.setattr(api_linear, "_ready", {})
    monkeypatch.setattr(api_bf16, "_ready", {})
    monkeypatch.setattr(api_bf16, "_fresh", {})
    monkeypatch.setattr(api_bf16_grouped, "_ready", {})
    monkeypatch.setattr(api_quant, "_kernel_ready", {})  # warm quantizer calls skip the path choice too


def test_guard_is_installed(gpu_guard: GpuGuard) -> None:
    assert isinstance(gpu_guard, GpuGuard)
    assert gpu_guard.patched, "no reference function bound in deepgemm.api / ops / nn was found to guard"
    assert gpu_guard.counting_launches, "deepgemm.jit.runtime.LoadedKernel.launch is gone: launches are not counted"
    assert deepgemm.backend_for(torch.empty(0, device="cuda")) == "sm90"


@pytest.mark.parametrize("name", list(CALLS))
def test_forced_reference_path_fails_the_test(name: str, gpu_guard: GpuGuard, monkeypatch: pytest.MonkeyPatch) -> None:
    import deepgemm.api.backend as backend

    call = CALLS[name][0]()  # inputs made on the kernel path
    torch.cuda.synchronize()
    _no_warm_launches(monkeypatch)
    monkeypatch.setattr(backend, "_backend_for_device", lambda device: "reference")  # as DEEPGEMM_FORCE_REFERENCE
    assert deepgemm.backend_for(torch.empty(0, device="cuda")) == "reference"
    with pytest.raises(AssertionError, match="reference path ran on CUDA tensors"):
        call()
    assert gpu_guard.reference_calls, "the reference path ran but the guard recorded nothing"
    with pytest.raises(AssertionError, match="reference path ran on CUDA tensors"):
        gpu_guard.verify()  # what the fixture's teardown runs: the test would fail even had the error been swallowed
    gpu_guard.reference_calls.clear()  # failing was the point here


@pytest.mark.parametrize("name", list(CALLS))
def test_kernel_path_launches_and_refuses_nothing(name: str, gpu_guard: GpuGuard,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    builder, entry = CALLS[name]
    call = builder()
    _no_warm_launches(monkeypatch)
    before = gpu_guard.launches(entry)
    call()
    torch.cuda.synchronize()
    assert gpu_guard.launches(entry) > before, f"{name} launched no {entry}* kernel"
    assert not gpu_guard.reference_calls


def test_direct_reference_calls_and_cpu_calls_still_run(gpu_guard: GpuGuard) -> None:
    a, b = random_operands(40, 264, 528, "cuda", seed=6)
    ref = reference_fp64(a, b)  # deepgemm.reference itself, on CUDA tensors: the yardstick stays usable
    assert ref.is_cuda and torch.isfinite(ref).all()
    a_cpu = (a[0].cpu(), a[1].cpu())
    b_cpu = (b[0].cpu(), b[1].cpu())
    on_cpu = deepgemm.fp8_gemm_nt(a_cpu, b_cpu)  # CPU tensors take the reference path by design
    assert on_cpu.device.type == "cpu"
    assert deepgemm.calc_diff(on_cpu.double(), ref.cpu()) < 1e-3
    assert not gpu_guard.reference_calls
