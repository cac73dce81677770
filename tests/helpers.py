"""Inputs and float64 references shared by the CPU and GPU tests."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
import torch

from deepgemm.reference import fp8_gemm_nt_reference


_Item = TypeVar("_Item")
_Built = TypeVar("_Built")


def build_in_isolated_cache(tmp_path_factory: pytest.TempPathFactory, build: Callable[[_Item], _Built],
                            items: Iterable[_Item]) -> list[_Built]:
    """`build` over `items` on 4 threads, compiling into a cache of the session's temp dir unless DEEPGEMM_CACHE_DIR
    is set (module fixtures run before conftest's function-scoped cache isolation)."""
    with pytest.MonkeyPatch.context() as mp:
        if "DEEPGEMM_CACHE_DIR" not in os.environ:
            mp.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "deepgemm-cache"))
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(build, items))


def random_operands(m: int, n: int, k: int, device: str | torch.device, seed: int | None = None):
    """Fresh random FP8 operands with scales, quantized by deepgemm's own quantizers on `device`.

    Rows get different magnitudes so per-row and per-block scales matter.
    """
    import deepgemm

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed if seed is not None else torch.seed() % (2**31))
    x = torch.randn(m, k, generator=gen) * torch.exp(torch.randn(m, 1, generator=gen))
    w = torch.randn(n, k, generator=gen) * torch.exp(torch.randn(n, 1, generator=gen) * 0.5)
    x = x.to(device=device, dtype=torch.bfloat16)
    w = w.to(device=device, dtype=torch.bfloat16)
    a = deepgemm.quantize_per_token_group(x)
    b = deepgemm.quantize_per_block(w)
    return a, b


def reference_fp64(a, b) -> torch.Tensor:
    return fp8_gemm_nt_reference(a[0], a[1], b[0], b[1], compute_dtype=torch.float64)


def reference_abs_fp64(a, b) -> torch.Tensor:
    """|A*sfa| @ |B*sfb|^T: the magnitude of each output's summands, the basis of summation error."""
    return fp8_gemm_nt_reference(a[0].float().abs(), a[1].abs(), b[0].float().abs(), b[1].abs(), compute_dtype=torch.float64)


def assert_close_to_reference(out: torch.Tensor, ref: torch.Tensor, ref_abs: torch.Tensor, max_diff: float = 1e-3) -> None:
    """calc_diff below `max_diff`, no NaN/Inf, and every element within output rounding plus summation error.

    The element bound is 2^-7 |ref| (bf16 output rounding) + 2^-10 (|A| |B|^T) (tensor-core FP8 partial
    sums carry ~14 mantissa bits before each 128-K promotion): a wrong scale, a missing K block or a
    misplaced tile breaks it by orders of magnitude.
    """
    import deepgemm

    assert out.shape == ref.shape
    out64 = out.double()
    assert torch.isfinite(out64).all(), "output has NaN/Inf (unwritten or overflowed elements)"
    diff = deepgemm.calc_diff(out64, ref)
    assert diff < max_diff, f"calc_diff {diff:.3e} >= {max_diff:.1e}"
    tolerance = 2**-7 * ref.abs() + 2**-10 * ref_abs + 1e-30
    excess = ((out64 - ref).abs() - tolerance).max().item() if ref.numel() else -1.0
    assert excess <= 0, f"element-wise error exceeds the bound by {excess:.3e}"


def random_grouped_weights(groups: int, n: int, k: int, device: str | torch.device, seed: int):
    """(B e4m3 [G, N, K], sfb [G, ceil(N/128), ceil(K/128)]) quantized per expert with deepgemm's quantizer."""
    import deepgemm

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    w = (torch.randn(groups, n, k, generator=gen) * torch.exp(torch.randn(groups, n, 1, generator=gen) * 0.5))
    w = w.to(device=device, dtype=torch.bfloat16)
    parts = [deepgemm.quantize_per_block(w[g]) for g in range(groups)]
    return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])


def random_activations(rows: int, k: int, device: str | torch.device, seed: int):
    """(A e4m3 [rows, K], sfa [rows, ceil(K/128)] M-major) with per-row magnitudes."""
    import deepgemm

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    x = torch.randn(rows, k, generator=gen) * torch.exp(torch.randn(rows, 1, generator=gen))
    return deepgemm.quantize_per_token_group(x.to(device=device, dtype=torch.bfloat16))


def outcome(call: Callable[[], object]) -> tuple[type, str] | None:
    """(exception type, message) of `call`, or None when it returns: calls on two paths are compared by outcome."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the outcome is compared, whatever it is
        return type(error), str(error)
    return None


def no_launch(*args: object, **kwargs: object) -> object:
    """Stands in for planning/launch where a test routes CPU tensors to the kernel path: reaching it fails."""
    raise AssertionError("the kernel path reached planning/launch")


class GraphRecorder:
    """A Dynamo backend that keeps every graph it is handed and runs it as is."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.graphs.append(gm)
        return gm.forward

    def targets(self) -> set[str]:
        """Called functions, overload packets and overloads alike by their packet name (deepgemm.fp8_gemm_nt)."""
        return {str(node.target).removesuffix(".default") for gm in self.graphs for node in gm.graph.nodes
                if node.op == "call_function"}


def assert_clean_build(name: str, resources: object, log: str, threads: int | None) -> None:
    """A compiled kernel's ptxas report: present, no spills, no stack frame, and (for `threads` per CTA) registers
    that fit one CTA per SM."""
    r = resources
    assert r is not None, f"{name}: no ptxas resource report in log:\n{log}"
    assert r.spill_stores == 0 and r.spill_loads == 0, f"{name}: spills {r}"
    assert r.stack_frame == 0, f"{name}: stack frame {r}"
    assert 0 < r.registers <= 255
    if threads is not None:
        assert r.registers * threads <= 65536, f"{name}: {r.registers} registers x {threads} threads"


def bf16_layout_operands(layout: str, m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh BF16 operands on the GPU as `bf16_gemm_<layout>` stores them (global generator: the `seed` fixture
    seeds it): A [M, K] or [K, M], B [N, K] or [K, N]."""
    a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda").to(torch.bfloat16)
    b = torch.randn((n, k) if layout[1] == "t" else (k, n), device="cuda").to(torch.bfloat16)
    return a, b


def check_bf16_gemm(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """A BF16 GEMM's output against its float64 reference: every element written, calc_diff within the output
    dtype's rounding."""
    from deepgemm.utils import calc_diff

    assert not out.isnan().any(), f"{what}: NaN left in the output (an element was never written)"
    diff = calc_diff(out.double(), ref)
    limit = 2e-5 if out.dtype == torch.bfloat16 else 1e-8
    assert diff < limit, f"{what}: calc_diff {diff:.3e} >= {limit:g}"


def assert_bf16_graph_replays(layout: str, m: int, n: int, k: int, replays: int) -> None:
    """bf16_gemm_<layout> warmed eagerly, captured in a CUDA graph, and replayed on fresh data copied into the
    captured operands: each replay's NaN-poisoned output against float64."""
    import deepgemm
    from deepgemm.reference import bf16_gemm_reference

    gemm = getattr(deepgemm, f"bf16_gemm_{layout}")
    a, b = bf16_layout_operands(layout, m, n, k)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out)  # warm: compiled and loaded before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(a, b, out)
    for _ in range(replays):
        fresh_a, fresh_b = bf16_layout_operands(layout, m, n, k)
        a.copy_(fresh_a)
        b.copy_(fresh_b)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_bf16_gemm(out, bf16_gemm_reference(a, b, layout, None, torch.float64), f"{layout} {m}x{n}x{k} replay")


def assert_wrong_ranks_raise_typed(op: Callable[..., object], args: tuple) -> int:
    """Each tensor argument of `args` in turn flattened (to 1-D; a 1-D one to its first element, a 3-D one also to
    2-D) and given to the real and the fake kernel of `op`: both must raise the public functions' ValueError or
    TypeError (never an IndexError or RuntimeError from computing an output shape first). Returns the number of
    cases run."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = 0
    wrong = [(i, arg[0] if arg.dim() == 1 else arg.reshape(-1)) for i, arg in enumerate(args)
             if isinstance(arg, torch.Tensor) and arg.dim() > 0]
    wrong += [(i, arg.reshape(-1, arg.shape[2])) for i, arg in enumerate(args)
              if isinstance(arg, torch.Tensor) and arg.dim() == 3]
    for i, lower in wrong:
        bad = args[:i] + (lower,) + args[i + 1:]
        for fake in (False, True):
            if fake:
                mode = FakeTensorMode()
                call_args = tuple(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in bad)
            try:
                if fake:
                    with mode:
                        op(*call_args)
                else:
                    op(*bad)
            except (ValueError, TypeError):
                pass
            else:
                raise AssertionError(f"argument {i} with shape {tuple(lower.shape)} was accepted (fake={fake})")
            cases += 1
    return cases


def poison_allocator(nbytes: int, count: int = 2) -> None:
    """Leave `count` freed blocks of `nbytes` 0xFF bytes (NaN in e4m3, float16, bfloat16 and float32) in the caching
    allocator: the next allocations of that size (a kernel's outputs) reuse them, so an element a kernel never writes
    reads NaN."""
    blocks = [torch.full((nbytes,), 255, dtype=torch.uint8, device="cuda") for _ in range(count)]
    del blocks
