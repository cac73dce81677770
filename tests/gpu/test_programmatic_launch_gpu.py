"""Programmatic dependent launch (deepgemm.set_pdl) on an sm_90 GPU: a kernel of ours launched while the kernel
before it is still running must read what that kernel writes, never what was there before.

The producer here (`late_writer`) lets its dependents launch at once (griddepcontrol.launch_dependents), then holds
its few CTAs for DELAY_NS before copying its source into the tensor the next call reads; the rest of the SMs stay
free, so a dependent that did not wait would run in that window and read the old contents. The control test proves
the window is real on this GPU (a copy kernel without the wait reads the old words), so the other checks can fail.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator

import pytest
import torch

import deepgemm
from deepgemm.jit.args import U64, PackedArgs
from deepgemm.jit.compiler import KernelSource
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream, launch_on_device
from deepgemm.kernels.common.loader import load_kernel
from deepgemm.reference import bf16_gemm_reference, m_grouped_masked_reference
from tests.gpu.checks import kgrouped_references, masked_operands
from tests.helpers import assert_close_to_reference, check_bf16_gemm, random_operands, reference_abs_fp64, reference_fp64

pytestmark = [pytest.mark.gpu, pytest.mark.quick]

DELAY_NS = 20_000_000  # the writer's hold: far longer than any launch here takes to start
WRITER_CTAS = 4  # SMs the writer occupies; the others are free for a dependent that does not wait
THREADS = 128

_PROBES = r"""
__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ void copy_words(const unsigned int* src, unsigned int* dst, unsigned long long words) {
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
        dst[i] = src[i];
    }
}

// Waits for its own predecessor (it may itself be launched programmatically), lets its dependents launch, holds
// for delay_ns, then copies.
extern "C" __global__ void late_writer(const unsigned int* src, unsigned int* dst, unsigned long long words,
                                       unsigned long long delay_ns) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const unsigned long long start = now_ns();
    while (now_ns() - start < delay_ns) {
    }
    copy_words(src, dst, words);
}

extern "C" __global__ void copy_without_wait(const unsigned int* src, unsigned int* dst, unsigned long long words,
                                             unsigned long long unused) {
    copy_words(src, dst, words);
}

extern "C" __global__ void copy_after_wait(const unsigned int* src, unsigned int* dst, unsigned long long words,
                                           unsigned long long unused) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    copy_words(src, dst, words);
}
"""


@pytest.fixture(autouse=True)
def pdl_off_after() -> Iterator[None]:
    yield
    deepgemm.set_pdl(False)


def _probe(entry: str) -> LoadedKernel:
    return load_kernel(KernelSource(_PROBES, entry, f"PDL test {entry}"), 0, 0)


def _launch_probe(entry: str, src: torch.Tensor, dst: torch.Tensor, ctas: int, delay_ns: int = 0) -> None:
    """`entry` copying src's bytes over dst's (same size, a multiple of 4 bytes) with `ctas` CTAs, on the current
    stream, with or without the programmatic attribute as set_pdl says."""
    assert src.nbytes == dst.nbytes and src.nbytes % 4 == 0 and src.is_contiguous() and dst.is_contiguous()
    kernel = _probe(entry)
    stream = current_raw_stream(0)
    args = PackedArgs([U64(src.data_ptr()), U64(dst.data_ptr()), U64(src.nbytes // 4), U64(delay_ns)])
    launch_on_device(kernel, 0, stream, kernel.launch_config(0, stream, ctas, THREADS), args.address)


def _late_write(src: torch.Tensor, dst: torch.Tensor) -> None:
    _launch_probe("late_writer", src, dst, WRITER_CTAS, DELAY_NS)


def _warm_probes() -> None:
    """Each probe loaded and launched once, plainly, on one word (a lazily loaded module may synchronize the context
    at its first launch), with its launch configs built on the current stream: from here on nothing but launches
    happens between the writer's launch and the next one."""
    word, spare = torch.zeros(1, dtype=torch.int32, device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")
    for entry, ctas in (("late_writer", WRITER_CTAS), ("copy_without_wait", 64), ("copy_after_wait", 64)):
        assert _probe(entry).entry == entry
        _launch_probe(entry, word, spare, ctas)
    torch.cuda.synchronize()


@contextlib.contextmanager
def _programmatic_window() -> Iterator[None]:
    """PDL on and the garbage collector off for a writer's launch and the launches behind it; afterwards, a check that
    the host issued them within half the writer's hold (else the window may have closed before they started)."""
    gc.disable()
    deepgemm.set_pdl(True)
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        deepgemm.set_pdl(False)
        gc.enable()
    assert elapsed < DELAY_NS / 2e9, f"the launches took {elapsed * 1e3:.1f} ms of host time, past half the hold"


@contextlib.contextmanager
def _on_stream(which: str) -> Iterator[None]:
    """Run on the default stream or on a side stream that first waits for the work queued so far."""
    if which == "default":
        yield
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream().wait_stream(side)


@pytest.mark.parametrize("stream", ["side", "default"])
def test_the_race_window_is_real(stream: str) -> None:
    """Launched programmatically after the writer, a copy without the wait reads the old words; with the wait, the new
    ones. (Without this, the tests below could pass against a kernel that never waits.) On a side stream, where the
    other race tests run, and on the default stream."""
    old = torch.zeros(1 << 20, dtype=torch.int32, device="cuda")
    new = torch.arange(1 << 20, dtype=torch.int32, device="cuda") + 1
    for entry, expected in (("copy_without_wait", old), ("copy_after_wait", new)):
        dst, probe = old.clone(), torch.full_like(old, -1)
        with _on_stream(stream):
            _warm_probes()
            with _programmatic_window():
                _late_write(new, dst)
                _launch_probe(entry, dst, probe, 64)
        torch.cuda.synchronize()
        assert torch.equal(dst, new), "the writer did not finish its copy"
        stale = (probe == old).float().mean().item()
        assert torch.equal(probe, expected), f"{entry} ({stream} stream): {stale:.1%} of the words read before the copy"


def _rewrite_then(call, src: torch.Tensor, dst: torch.Tensor) -> None:  # noqa: ANN001
    """On a side stream: `call` warmed (compiled, planned, its launch configs built) with PDL off on dst's old
    contents, then launched programmatically right behind a late writer of src over dst."""
    with _on_stream("side"):
        call()
        _warm_probes()
        with _programmatic_window():
            _late_write(src, dst)
            call()
    torch.cuda.synchronize()


@pytest.mark.parametrize(("m", "n", "k"), [(256, 2112, 7168), (64, 2112, 7168), (4096, 7168, 2048)],
                         ids=["one-wave", "decode-split-k", "multi-wave"])
def test_fp8_gemm_reads_the_previous_kernels_output(seed: int, m: int, n: int, k: int) -> None:
    """The writer replaces A (its bytes): the GEMM's result is the new A's, in the dense, split-K and multi-wave
    kernels alike."""
    a, b = random_operands(m, n, k, "cuda", seed)
    fresh, _ = random_operands(m, n, k, "cuda", seed + 1)
    live = (a[0].clone(), a[1])
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    _rewrite_then(lambda: deepgemm.fp8_gemm_nt(live, b, out), fresh[0], live[0])
    new_a = (fresh[0], a[1])
    assert_close_to_reference(out, reference_fp64(new_a, b), reference_abs_fp64(new_a, b))


def test_masked_gemm_reads_the_previous_kernels_group_sizes(seed: int) -> None:
    """The writer replaces masked_m (all zero before: nothing would be computed) and the kernel's scheduler must see
    the new counts."""
    groups, max_m, n, k = 4, 256, 1024, 2048
    a, b = masked_operands(groups, max_m, n, k, seed)
    counts = torch.tensor([200, 0, 256, 17], dtype=torch.int32, device="cuda")
    masked_m = torch.zeros_like(counts)
    out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    _rewrite_then(lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, 128), counts, masked_m)
    ref = m_grouped_masked_reference(a[0], a[1], b[0], b[1], counts.cpu(), torch.float64)
    ref_abs = m_grouped_masked_reference(a[0].float().abs(), a[1].abs(), b[0].float().abs(), b[1].abs(), counts.cpu(),
                                         torch.float64)
    for group, count in enumerate(counts.tolist()):
        assert_close_to_reference(out[group, :count], ref[group, :count], ref_abs[group, :count])


def test_bf16_gemm_reads_the_previous_kernels_output(seed: int) -> None:
    m, n, k = 512, 4096, 4096
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    fresh = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    live = a.clone()
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    _rewrite_then(lambda: deepgemm.bf16_gemm_nt(live, b, out), fresh, live)
    check_bf16_gemm(out, bf16_gemm_reference(fresh, b, "nt", compute_dtype=torch.float64), "bf16 nt after a writer")


def test_quantizer_reads_the_previous_kernels_output(seed: int) -> None:
    m, k = 300, 7168
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    fresh = (torch.randn(m, k, device="cuda") * 3).to(torch.bfloat16)
    live = x.clone()
    results: list[tuple[torch.Tensor, torch.Tensor]] = []
    _rewrite_then(lambda: results.append(deepgemm.quantize_per_token_group(live)), fresh, live)
    expected = deepgemm.quantize_per_token_group(fresh)  # PDL off, after everything above finished
    q, sf = results[-1]
    assert torch.equal(q.view(torch.uint8), expected[0].view(torch.uint8)) and torch.equal(sf, expected[1])
    assert not torch.equal(sf, results[0][1])  # the old x's scales differ: the check can fail


def test_k_grouped_gemm_reads_the_previous_kernels_output(seed: int) -> None:
    """The writer replaces A (dY^T, token-major) of the k-grouped FP8 kernel (the 1D1D family)."""
    m, n, ks = 1024, 2048, [512, 0, 1024, 384]
    k_total = sum(ks)
    a = deepgemm.quantize_per_token_group(torch.randn(m, k_total, device="cuda").to(torch.bfloat16))
    fresh = deepgemm.quantize_per_token_group((torch.randn(m, k_total, device="cuda") * 2).to(torch.bfloat16))
    b = deepgemm.quantize_per_token_group(torch.randn(n, k_total, device="cuda").to(torch.bfloat16))
    live = (a[0].clone(), fresh[1])
    out = torch.full((len(ks), m, n), float("nan"), device="cuda")
    _rewrite_then(lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(live, b, out, ks), fresh[0], live[0])
    refs, abs_refs = kgrouped_references(fresh, b, ks, None)
    for group, k in enumerate(ks):
        if k:
            assert_close_to_reference(out[group], refs[group], abs_refs[group], max_diff=1e-5)
        else:
            assert torch.equal(out[group], torch.zeros_like(out[group]))


def test_block_quantizer_reads_the_previous_kernels_output(seed: int) -> None:
    n, k = 1024, 2048
    w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    fresh = (torch.randn(n, k, device="cuda") * 3).to(torch.bfloat16)
    live = w.clone()
    results: list[tuple[torch.Tensor, torch.Tensor]] = []
    _rewrite_then(lambda: results.append(deepgemm.quantize_per_block(live)), fresh, live)
    expected = deepgemm.quantize_per_block(fresh)
    q, sf = results[-1]
    assert torch.equal(q.view(torch.uint8), expected[0].view(torch.uint8)) and torch.equal(sf, expected[1])
    assert not torch.equal(sf, results[0][1])


def test_quantize_then_gemm_chain_is_bitwise_the_plain_launch(seed: int) -> None:
    """The public quantize + GEMM pair launched programmatically back to back (the quantizer lets the GEMM launch
    early) gives bitwise the plain launches' result, eagerly and replayed from a CUDA graph captured with PDL on."""
    m, n, k = 64, 4096, 7168
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = deepgemm.quantize_per_block(torch.randn(n, k, device="cuda").to(torch.bfloat16))

    def pair() -> torch.Tensor:
        return deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(x), w)

    plain = pair()
    deepgemm.set_pdl(True)
    eager = [pair() for _ in range(3)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = pair()
    deepgemm.set_pdl(False)
    x.copy_((torch.randn(m, k, device="cuda") * 2).to(torch.bfloat16))
    graph.replay()
    replayed = static_out.clone()
    expected = pair()  # plain launches on the new x
    torch.cuda.synchronize()
    assert all(torch.equal(out, plain) for out in eager)
    assert torch.equal(replayed, expected) and not torch.equal(replayed, plain)
    a = deepgemm.quantize_per_token_group(x)
    assert_close_to_reference(expected, reference_fp64(a, w), reference_abs_fp64(a, w))


def test_every_launch_reads_the_switch(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """A warm public call hands the driver the programmatic launch config exactly while the switch is on (read per
    launch: no plan or cached config keeps the old mode)."""
    seen: list[tuple[bool, bool]] = []
    real = LoadedKernel.launch

    def spy(self: LoadedKernel, configs, args_address: int, device_index: int | None = None) -> None:  # noqa: ANN001
        real_ex = self._launch_ex

        def record(config, kernel, args, extra):  # noqa: ANN001, ANN202
            seen.append((deepgemm.get_pdl(), config is configs[1] and configs[1] is not configs[0]))
            return real_ex(config, kernel, args, extra)

        self._launch_ex = record
        try:
            real(self, configs, args_address, device_index)
        finally:
            self._launch_ex = real_ex

    a, b = random_operands(128, 512, 512, "cuda", seed)
    out = torch.empty(128, 512, dtype=torch.bfloat16, device="cuda")
    deepgemm.fp8_gemm_nt(a, b, out)  # warm
    with monkeypatch.context() as patch:
        patch.setattr(LoadedKernel, "launch", spy)
        for enabled in (False, True, False, True):
            deepgemm.set_pdl(enabled)
            deepgemm.fp8_gemm_nt(a, b, out)
    torch.cuda.synchronize()
    assert seen == [(False, False), (True, True), (False, False), (True, True)]
