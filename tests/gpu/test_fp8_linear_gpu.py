"""The launch-ready quantize + GEMM path (deepgemm.api.linear.fp8_linear, Fp8Linear's eager forward) on an sm_90
GPU: warm calls skip the checked path, and give bit for bit what quantize_per_token_group + fp8_gemm_nt give
(the same two kernels), on new data at old pointers, on new pointers, on a side stream, with an SM cap, with
outputs written over NaN-poisoned memory."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import deepgemm
from deepgemm.api import linear as linear_api
from deepgemm.nn import Fp8Linear

pytestmark = [pytest.mark.gpu, pytest.mark.quick, pytest.mark.usefixtures("small_fp8_route")]


@pytest.fixture
def checked_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls that took the checked path (the rest took the launch-ready one); starts from an empty table,
    so no entry of an earlier test (at a reused pointer) serves this one's first call."""
    monkeypatch.setattr(linear_api, "_ready", {})
    calls: list[int] = []
    original = linear_api._checked

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(linear_api, "_checked", counted)
    return calls


def _two_calls(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, out_dtype: torch.dtype,
               num_sms: int | None = None) -> torch.Tensor:
    return deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(x), (w, s), out_dtype=out_dtype, num_sms=num_sms)


def _float64(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    q, sf = deepgemm.quantize_per_token_group(x)
    return deepgemm.dequantize_per_token_group(q, sf, dtype=torch.float64) @ \
        deepgemm.dequantize_per_block(w, s, dtype=torch.float64).t()


def _poison(y: torch.Tensor) -> None:
    """NaN over a returned output before it is freed: the next call's output likely reuses the block."""
    y.fill_(float("nan"))


@pytest.mark.parametrize("m,n,k,dtype,out_dtype", [
    (1, 2112, 7168, torch.bfloat16, torch.bfloat16),
    (77, 100, 272, torch.float32, torch.bfloat16),      # N rows padded to 16 bytes, K tail
    (129, 4096, 144, torch.float16, torch.float32),
    (4097, 2056, 7296, torch.bfloat16, torch.bfloat16),  # 1-row last block, N and K tails
])
def test_warm_calls_match_the_two_public_calls(m: int, n: int, k: int, dtype: torch.dtype, out_dtype: torch.dtype,
                                               seed: int, checked_calls: list[int]) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(m, k, device="cuda", generator=gen) * torch.exp(torch.randn(m, 1, device="cuda",
                                                                                 generator=gen))).to(dtype)
    w, s = deepgemm.quantize_per_block(torch.randn(n, k, device="cuda", generator=gen))
    for step in range(4):
        if step == 2:  # new values at the same pointer
            x.copy_(torch.randn(m, k, device="cuda", generator=gen).to(dtype))
        y = linear_api.fp8_linear(x, w, s, out_dtype)
        assert y.shape == (m, n) and y.dtype == out_dtype
        assert torch.equal(y, _two_calls(x, w, s, out_dtype)), step
        assert deepgemm.calc_diff(y.double(), _float64(x, w, s)) < 1e-5
        _poison(y)
        del y
    assert len(checked_calls) == 1  # only the first call was checked


def test_new_pointers_side_stream_and_sm_cap(seed: int, checked_calls: list[int]) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    m, n, k = 300, 1536, 1024
    w, s = deepgemm.quantize_per_block(torch.randn(n, k, device="cuda", generator=gen))
    xs = [torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3)]
    linear_api.fp8_linear(xs[0], w, s)
    for x in xs:  # each x has its own pointer: an entry each, then warm
        assert torch.equal(linear_api.fp8_linear(x, w, s), _two_calls(x, w, s, torch.bfloat16))
        assert torch.equal(linear_api.fp8_linear(x, w, s), _two_calls(x, w, s, torch.bfloat16))
    assert len(checked_calls) == 3
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y_side = [linear_api.fp8_linear(x, w, s) for x in xs for _ in range(2)]
    torch.cuda.current_stream().wait_stream(side)
    assert len(checked_calls) == 3  # the stream picks the launch, not the entry
    for i, y in enumerate(y_side):
        assert torch.equal(y, _two_calls(xs[i // 2], w, s, torch.bfloat16))
    capped = [linear_api.fp8_linear(xs[0], w, s, num_sms=20) for _ in range(2)]
    assert len(checked_calls) == 4  # its own entry, its own plan
    entry = linear_api._ready[linear_api._key(xs[0], w, s, torch.bfloat16, 20)]
    assert entry.plan.grid <= 20
    for y in capped:
        assert torch.equal(y, _two_calls(xs[0], w, s, torch.bfloat16, num_sms=20))


def test_module_forward_takes_the_ready_path(seed: int, checked_calls: list[int]) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    layer = Fp8Linear.from_linear(nn.Linear(512, 768, dtype=torch.bfloat16, device="cuda"))
    with torch.no_grad():
        layer.bias.copy_(torch.randn(768, device="cuda", generator=gen))
    x = torch.randn(2, 45, 512, device="cuda", generator=gen).to(torch.bfloat16)
    with torch.inference_mode():
        ys = [layer(x) for _ in range(3)]
        ref = _two_calls(x.reshape(-1, 512), layer.weight, layer.weight_scale_inv, torch.bfloat16) + layer.bias
        # New weights loaded in place: same pointers, new values, read at the next launch.
        w2, s2 = deepgemm.quantize_per_block(torch.randn(768, 512, device="cuda", generator=gen))
        layer.load_fp8_weight(w2, s2)
        y2 = layer(x)
        ref2 = _two_calls(x.reshape(-1, 512), w2, s2, torch.bfloat16) + layer.bias
    assert len(checked_calls) == 1
    for y in ys:
        assert y.shape == (2, 45, 768) and torch.equal(y.reshape(-1, 768), ref)
    assert torch.equal(y2.reshape(-1, 768), ref2)


def test_unit_stride_copy_is_never_remembered(seed: int, checked_calls: list[int]) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w, s = deepgemm.quantize_per_block(torch.randn(256, 512, device="cuda", generator=gen))
    x = torch.randn(512, 40, device="cuda", generator=gen).to(torch.bfloat16).t()  # column stride 40
    for _ in range(2):
        assert torch.equal(linear_api.fp8_linear(x, w, s), _two_calls(x, w, s, torch.bfloat16))
    assert len(checked_calls) == 2


def test_graph_capture_after_eager_calls_keeps_its_own_temporaries(seed: int, checked_calls: list[int],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A captured call must not use the eager scratch block (eager calls on another stream than the replay's could
    overwrite it meanwhile): it takes its temporaries from the graph's pool. Values alone cannot show that here
    (replays and eager calls share one stream, so run in order): the recorded scratch uses do."""
    scratch_uses: list[bool] = []
    original = linear_api._scratch_block

    def recorded(*args: object) -> torch.Tensor:
        scratch_uses.append(torch.cuda.is_current_stream_capturing())
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(linear_api, "_scratch_block", recorded)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    m, n, k = 64, 2048, 1024
    w, s = deepgemm.quantize_per_block(torch.randn(n, k, device="cuda", generator=gen))
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    other = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm, on the stream the capture will use
            linear_api.fp8_linear(x, w, s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            y_graph = linear_api.fp8_linear(x, w, s)
        expected = _two_calls(x, w, s, torch.bfloat16)
        for _ in range(3):
            graph.replay()
            y_other = linear_api.fp8_linear(other, w, s)  # eager, same stream, between replays
            assert torch.equal(y_graph, expected)
            assert torch.equal(y_other, _two_calls(other, w, s, torch.bfloat16))
    torch.cuda.current_stream().wait_stream(stream)
    assert len(checked_calls) == 2  # x and other each checked once; the captured call was launch-ready
    assert scratch_uses and not any(scratch_uses)  # eager calls used the scratch, the captured one did not


def test_warm_entries_still_refuse_what_the_public_calls_refuse(seed: int, checked_calls: list[int]) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w, s = deepgemm.quantize_per_block(torch.randn(256, 512, device="cuda", generator=gen))
    x = torch.randn(64, 512, device="cuda", generator=gen).to(torch.bfloat16)
    for sms in (1, 66):
        for _ in range(2):
            linear_api.fp8_linear(x, w, s, num_sms=sms)
    for bad in (True, 66.0):  # equal to the remembered 1 and 66 as keys
        with pytest.raises(TypeError, match="num_sms"):
            linear_api.fp8_linear(x, w, s, num_sms=bad)
    linear_api.fp8_linear(x, w, s)
    grad_x = x.detach().clone().requires_grad_()
    linear_api.fp8_linear(grad_x.detach(), w, s)
    with pytest.raises(deepgemm.NotDifferentiableError, match="'x'"):
        linear_api.fp8_linear(grad_x, w, s)


def test_threads_sharing_the_default_stream(seed: int) -> None:
    """Threads start on the default stream: their warm calls share its scratch block and must not interleave a
    quantize of one between the quantize and the GEMM of another; and a thread whose first CUDA work is our
    launch gets torch's context bound (cuLaunchKernelEx would refuse it with CUDA_ERROR_INVALID_CONTEXT)."""
    import threading

    gen = torch.Generator(device="cuda").manual_seed(seed)
    w, s = deepgemm.quantize_per_block(torch.randn(2048, 1024, device="cuda", generator=gen))
    xs = [torch.randn(m, 1024, device="cuda", generator=gen).to(torch.bfloat16) for m in (3, 77, 130, 256)]
    expected = [_two_calls(x, w, s, torch.bfloat16) for x in xs]
    failures: list[str] = []

    def worker(i: int) -> None:
        try:  # (a new thread's first CUDA work is this launch: no context is current there yet)
            for step in range(200):
                y = linear_api.fp8_linear(xs[i], w, s)
                if step % 20 == 19 and not torch.equal(y, expected[i]):
                    failures.append(f"thread {i} step {step}")
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            failures.append(f"thread {i}: {error!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not failures, failures
