"""The implementations a benchmark runs: deepgemm, its cuBLAS peers, and DeepGEMM where it is installed (FP8 in the
nt layout; BF16 in the nt, nn, tn or tt layout of one run).

Each one turns a :class:`Problem` into a zero-argument callable, or raises
:class:`Unavailable` with the reason it cannot serve that shape (reported as
"n/a", never a crash).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from deepgemm.analysis.gpus import Precision
from deepgemm.api import gemm as api_gemm
from deepgemm.bench import deepseek
from deepgemm.bench.inputs import GROUP, Problem
from deepgemm.ops import bf16 as ops_bf16

SCALE_BYTES = 4


class Unavailable(Exception):
    """This implementation cannot run this problem; ``str(exc)`` says why."""


class BenchProblem(Protocol):
    """What the runner reads of a problem (dense :class:`Problem`, or an MoE case's ``MoeProblem``)."""

    @property
    def m(self) -> int: ...

    @property
    def n(self) -> int: ...

    @property
    def k(self) -> int: ...

    @property
    def shape(self) -> tuple[int, int, int]: ...

    @property
    def label(self) -> str: ...  # an MoE case's label, "" for a dense shape


P = TypeVar("P", bound=BenchProblem)


@dataclass(frozen=True)
class Prepared:
    fn: Callable[[], Any]
    reference: Callable[[], Any]  # the float64 result ``fn`` should approximate (a tensor or inputs.RowBlockProduct)
    bytes: int  # HBM bytes one call must move at least: A, B, D and scales
    note: str = ""
    select: Callable[[Any], Any] | None = None  # fn's result -> the part `reference` covers (e.g. valid rows)


@dataclass(frozen=True)
class Implementation(Generic[P]):
    name: str
    description: str
    precision: Precision
    prepare: Callable[[P], Prepared]
    # What it computes; implementations of the same operation are timed interleaved (bench_gpu_interleaved).
    operation: str = ""
    # An optional peer: why it cannot run here (e.g. not installed), or None. A run leaves such a peer out
    # instead of reporting it "n/a" on every shape, and records why (``runner.runnable``).
    missing: Callable[[], str | None] | None = None

    @property
    def is_deepgemm(self) -> bool:
        return self.name.startswith("deepgemm")


def fp8_blockwise_bytes(m: int, n: int, k: int) -> int:
    k_groups = -(-k // GROUP)
    scales = (m * k_groups + -(-n // GROUP) * k_groups) * SCALE_BYTES
    return m * k + n * k + 2 * m * n + scales


def fp8_tensorwise_bytes(m: int, n: int, k: int) -> int:
    return m * k + n * k + 2 * m * n + 2 * SCALE_BYTES


def bf16_bytes(m: int, n: int, k: int) -> int:
    return 2 * (m * k + n * k + m * n)


# -- deepgemm ---------------------------------------------------------------------------------------------------

def _prepare_deepgemm_fp8(problem: Problem) -> Prepared:
    import torch

    out = torch.empty((problem.m, problem.n), dtype=torch.bfloat16, device=problem.a_fp8.device)
    a, b = (problem.a_fp8, problem.sfa), (problem.b_fp8, problem.sfb)
    return Prepared(lambda: api_gemm.fp8_gemm_nt(a, b, out), problem.reference,
                    fp8_blockwise_bytes(problem.m, problem.n, problem.k))


BF16_LAYOUTS = ("nt", "nn", "tn", "tt")

# D = A·Bᵀ as torch.matmul (cuBLAS) computes it from each layout's stored operands (Problem.bf16_operands).
CUBLAS_BF16_PRODUCTS: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {
    "nt": ("a @ b.t()", lambda a, b: a @ b.t()),
    "nn": ("a @ b", lambda a, b: a @ b),
    "tn": ("a.t() @ b", lambda a, b: a.t() @ b),
    "tt": ("a.t() @ b.t()", lambda a, b: a.t() @ b.t()),
}


def _prepare_deepgemm_bf16(problem: Problem, layout: str = "nt") -> Prepared:
    import torch

    gemm = getattr(ops_bf16, f"bf16_gemm_{layout}")
    a, b = problem.bf16_operands(layout)
    out = torch.empty((problem.m, problem.n), dtype=torch.bfloat16, device=a.device)
    return Prepared(lambda: gemm(a, b, out), problem.reference, bf16_bytes(problem.m, problem.n, problem.k))


# -- DeepGEMM (deepseek-ai) -------------------------------------------------------------------------------------

def deepseek_function(name: str) -> tuple[Any, Callable[..., Any]]:
    """(the deep_gemm module, its function `name`); Unavailable where DeepGEMM is not importable or lacks it."""
    try:
        module = deepseek.load()
    except deepseek.PeerMissing as exc:
        raise Unavailable(str(exc)) from None
    gemm = getattr(module, name, None)
    if gemm is None:
        raise Unavailable(f"this DeepGEMM ({deepseek.version()}) has no {name}")
    return module, gemm


def _prepare_deepseek_fp8(problem: Problem) -> Prepared:
    import torch

    _, gemm = deepseek_function("fp8_gemm_nt")
    sfa, note_a = deepseek.scales(problem.sfa, problem.m, problem.k, is_sfa=True)
    sfb, note_b = deepseek.scales(problem.sfb, problem.n, problem.k, is_sfa=False)
    out = torch.empty((problem.m, problem.n), dtype=torch.bfloat16, device=problem.a_fp8.device)
    a, b = (problem.a_fp8, sfa), (problem.b_fp8, sfb)
    note = "; ".join(dict.fromkeys(filter(None, (note_a, note_b, deepseek.version()))))

    def run() -> Any:
        gemm(a, b, out)  # writes `out`, returns nothing
        return out

    return Prepared(run, problem.reference, fp8_blockwise_bytes(problem.m, problem.n, problem.k), note)


def _prepare_deepseek_bf16(problem: Problem, layout: str = "nt") -> Prepared:
    import torch

    _, gemm = deepseek_function(f"bf16_gemm_{layout}")
    a, b = problem.bf16_operands(layout)  # the same stored operands as ours and cuBLAS's
    out = torch.empty((problem.m, problem.n), dtype=torch.bfloat16, device=a.device)

    def run() -> Any:
        gemm(a, b, out)  # writes `out`, returns nothing
        return out

    return Prepared(run, problem.reference, bf16_bytes(problem.m, problem.n, problem.k), deepseek.version())


# -- cuBLAS -----------------------------------------------------------------------------------------------------

def _prepare_cublas_blockwise(problem: Problem) -> Prepared:
    import torch
    import torch.nn.functional as F

    if problem.m == 1:
        raise Unavailable("cuBLAS block-wise FP8 refuses M = 1")
    if problem.n % 16:
        raise Unavailable(f"cuBLAS block-wise FP8 needs N % 16 == 0 (N = {problem.n})")
    a, b, sfa, sfb = problem.a_fp8, problem.b_fp8, problem.sfa_cublas, problem.sfb
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        recipe_a, recipe_b = F.ScalingType.BlockWise1x128, F.ScalingType.BlockWise128x128

        def run() -> Any:
            return F.scaled_mm(a, b.t(), sfa, recipe_a, sfb.t(), recipe_b, output_dtype=torch.bfloat16)

        note = "torch.nn.functional.scaled_mm"
    elif hasattr(torch, "_scaled_mm"):
        def run() -> Any:
            return torch._scaled_mm(a, b.t(), scale_a=sfa, scale_b=sfb.t(), out_dtype=torch.bfloat16)

        note = "torch._scaled_mm (block-wise scales inferred from their shapes)"
    else:
        raise Unavailable(f"this torch ({torch.__version__}) has neither F.scaled_mm nor torch._scaled_mm")
    return Prepared(run, problem.reference, fp8_blockwise_bytes(problem.m, problem.n, problem.k), note)


def _prepare_cublas_tensorwise(problem: Problem) -> Prepared:
    import torch

    if not hasattr(torch, "_scaled_mm"):
        raise Unavailable(f"this torch ({torch.__version__}) has no torch._scaled_mm")
    a, b = problem.a_fp8, problem.b_fp8
    one = torch.tensor(1.0, device=a.device)

    def run() -> Any:
        return torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return Prepared(run, problem.unscaled_reference, fp8_tensorwise_bytes(problem.m, problem.n, problem.k),
                    "unit per-tensor scales: an upper reference, not the same math")


def _prepare_cublas_bf16(problem: Problem, layout: str = "nt") -> Prepared:
    a, b = problem.bf16_operands(layout)
    product = CUBLAS_BF16_PRODUCTS[layout][1]
    note = "on the dequantized fp8 values rounded to bf16" if problem.precision == "fp8" else ""
    return Prepared(lambda: product(a, b), problem.reference, bf16_bytes(problem.m, problem.n, problem.k), note)


DEEPGEMM_FP8 = Implementation("deepgemm", "deepgemm.fp8_gemm_nt (1x128 / 128x128 scales)", "fp8",
                              _prepare_deepgemm_fp8, "fp8-blockwise")
DEEPSEEK_FP8 = Implementation("deepseek-deepgemm", "DeepGEMM (deepseek-ai) deep_gemm.fp8_gemm_nt, when installed",
                              "fp8", _prepare_deepseek_fp8, "fp8-blockwise", missing=deepseek.missing)
CUBLAS_BLOCKWISE = Implementation("cublas-blockwise", "cuBLAS FP8, 1x128 / 128x128 block scales", "fp8",
                                  _prepare_cublas_blockwise, "fp8-blockwise")
CUBLAS_TENSORWISE = Implementation("cublas-fp8-tensor", "cuBLAS FP8, per-tensor scales (upper reference)", "fp8",
                                   _prepare_cublas_tensorwise, "fp8-tensorwise")
CUBLAS_BF16 = Implementation("cublas-bf16", "cuBLAS BF16 (torch.matmul)", "bf16", _prepare_cublas_bf16, "bf16")



def bf16_implementations(layout: str = "nt") -> tuple[Implementation, ...]:
    """A ``--dtype bf16`` run in one layout: deepgemm.bf16_gemm_<layout>, DeepGEMM's deep_gemm.bf16_gemm_<layout>
    (when installed) and cuBLAS (torch.matmul), all on the same stored operands and timed interleaved (one
    operation). The names do not carry the layout: the run's settings record it."""
    if layout not in BF16_LAYOUTS:
        raise ValueError(f"argument --layout: must be one of {', '.join(BF16_LAYOUTS)}, got {layout!r}")
    expression = CUBLAS_BF16_PRODUCTS[layout][0]
    return (
        Implementation("deepgemm-bf16", f"deepgemm.bf16_gemm_{layout}", "bf16",
                       partial(_prepare_deepgemm_bf16, layout=layout), "bf16"),
        Implementation("deepseek-deepgemm-bf16", f"DeepGEMM (deepseek-ai) deep_gemm.bf16_gemm_{layout}, when installed",
                       "bf16", partial(_prepare_deepseek_bf16, layout=layout), "bf16", missing=deepseek.missing),
        Implementation("cublas-bf16", f"cuBLAS BF16 (torch.matmul: {expression} on the same stored operands)", "bf16",
                       partial(_prepare_cublas_bf16, layout=layout), "bf16"),
    )


DEEPGEMM_BF16, DEEPSEEK_BF16, CUBLAS_BF16_NT = bf16_implementations("nt")

IMPLEMENTATIONS: dict[Precision, tuple[Implementation, ...]] = {
    "fp8": (DEEPGEMM_FP8, DEEPSEEK_FP8, CUBLAS_BLOCKWISE, CUBLAS_TENSORWISE, CUBLAS_BF16),
    "bf16": (DEEPGEMM_BF16, DEEPSEEK_BF16, CUBLAS_BF16_NT),
}


def implementations_for(precision: Precision, layout: str = "nt") -> tuple[Implementation, ...]:
    """What a run of ``precision`` times: FP8 in the nt layout only; BF16 in any of the four layouts."""
    if precision == "bf16":
        return bf16_implementations(layout)
    if layout != "nt":
        raise ValueError(f"argument --layout: {layout} needs --dtype bf16 (the FP8 runs time fp8_gemm_nt)")
    return IMPLEMENTATIONS[precision]


ALL_IMPLEMENTATIONS: dict[str, Implementation] = {
    impl.name: impl for impls in IMPLEMENTATIONS.values() for impl in impls
}
