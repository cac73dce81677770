"""The implementations an MoE suite runs: deepgemm's grouped GEMM of the case's layout and DeepGEMM's (deepseek-ai)
where it is installed, on the same operands, timed interleaved (one operation). The names are the dense run's, so
results files, --compare and --relative-to treat both suites alike."""

from __future__ import annotations

from typing import Any

from deepgemm.api import grouped as api_grouped
from deepgemm.bench import deepseek
from deepgemm.bench.moe_inputs import MoeProblem
from deepgemm.bench.peers import Implementation, Prepared, Unavailable

OPERATION = "fp8-grouped"


def _valid_rows(problem: MoeProblem) -> Any:
    return lambda out: out[problem.valid_rows]


def _prepare_deepgemm(problem: MoeProblem) -> Prepared:
    case, out = problem.case, problem.output()
    if case.kind == "contiguous":
        def run() -> Any:
            return api_grouped.m_grouped_fp8_gemm_nt_contiguous(problem.a, problem.b, out, problem.grouping)
    else:
        def run() -> Any:
            return api_grouped.m_grouped_fp8_gemm_nt_masked(problem.a, problem.b, out, problem.grouping,
                                                            case.expected_m)
    return Prepared(run, problem.reference, case.hbm_bytes(), "", _valid_rows(problem))


def _prepare_deepseek(problem: MoeProblem) -> Prepared:
    try:
        module = deepseek.load()
    except deepseek.PeerMissing as exc:
        raise Unavailable(str(exc)) from None
    case = problem.case
    name = f"m_grouped_fp8_gemm_nt_{case.kind}"
    gemm = getattr(module, name, None)
    if gemm is None:
        raise Unavailable(f"this DeepGEMM ({deepseek.version()}) has no {name}")
    if case.kind == "contiguous":
        alignment = deepseek.m_alignment()
        if alignment is None or 128 % alignment:
            raise Unavailable(f"DeepGEMM's contiguous alignment ({alignment}) does not divide our 128-row segments")
        extra: tuple[Any, ...] = (problem.grouping,)
        sfa, note_a = deepseek.scales(problem.a[1], problem.a[0].shape[0], case.k, is_sfa=True)
    else:
        extra = (problem.grouping, case.expected_m)
        sfa, note_a = deepseek.scales(problem.a[1], case.max_m, case.k, is_sfa=True, groups=case.groups)
    sfb, note_b = deepseek.scales(problem.b[1], case.n, case.k, is_sfa=False, groups=case.groups)
    out = problem.output()
    a, b = (problem.a[0], sfa), (problem.b[0], sfb)

    def run() -> Any:
        gemm(a, b, out, *extra)  # writes `out`, returns nothing
        return out

    note = "; ".join(dict.fromkeys(filter(None, (note_a, note_b, deepseek.version()))))
    return Prepared(run, problem.reference, case.hbm_bytes(), note, _valid_rows(problem))


DEEPGEMM_MOE = Implementation("deepgemm", "deepgemm.m_grouped_fp8_gemm_nt_contiguous / _masked (the case's layout)",
                              "fp8", _prepare_deepgemm, OPERATION)
DEEPSEEK_MOE = Implementation("deepseek-deepgemm", "DeepGEMM (deepseek-ai) deep_gemm.m_grouped_fp8_gemm_nt_contiguous "
                              "/ _masked, when installed", "fp8", _prepare_deepseek, OPERATION,
                              missing=deepseek.missing)
MOE_IMPLEMENTATIONS: tuple[Implementation[MoeProblem], ...] = (DEEPGEMM_MOE, DEEPSEEK_MOE)
