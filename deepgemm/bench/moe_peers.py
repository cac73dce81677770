"""The implementations an MoE suite runs: deepgemm's grouped GEMM of the case's layout, DeepGEMM's (deepseek-ai)
where it is installed and, in BF16, ``torch._grouped_mm``, on the same operands, timed interleaved (one operation).
The names are the dense run's of the same dtype, so results files, --compare and --relative-to treat both suites
alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepgemm.analysis.gpus import Precision
from deepgemm.api import bf16_grouped as api_bf16_grouped
from deepgemm.api import grouped as api_grouped
from deepgemm.api import kgrouped as api_kgrouped
from deepgemm.bench import deepseek
from deepgemm.bench.moe_inputs import MoeProblem
from deepgemm.bench.peers import Implementation, Prepared, Unavailable, deepseek_function

OPERATION = "fp8-grouped"
BF16_OPERATION = "bf16-grouped"


def _valid_rows(problem: MoeProblem) -> Any:
    return lambda out: out[problem.valid_rows]


def _prepare_deepgemm(problem: MoeProblem) -> Prepared:
    case, out = problem.case, problem.output()
    if case.kind == "k-grouped":
        def run_k() -> Any:  # out += A_g B_g^T per expert: C = out, in place, as gradient accumulation runs it
            return api_kgrouped.k_grouped_fp8_gemm_tn_contiguous(problem.a, problem.b, out, problem.grouping, c=out)

        return Prepared(run_k, problem.reference, case.hbm_bytes(), "C = out (in place)")
    if case.kind == "contiguous":
        def run() -> Any:
            return api_grouped.m_grouped_fp8_gemm_nt_contiguous(problem.a, problem.b, out, problem.grouping)
    else:
        def run() -> Any:
            return api_grouped.m_grouped_fp8_gemm_nt_masked(problem.a, problem.b, out, problem.grouping,
                                                            case.expected_m)
    return Prepared(run, problem.reference, case.hbm_bytes(), "", _valid_rows(problem))


def _require_contiguous_alignment() -> None:
    """DeepGEMM's contiguous layout must accept our 128-row segments."""
    alignment = deepseek.m_alignment()
    if alignment is None or 128 % alignment:
        raise Unavailable(f"DeepGEMM's contiguous alignment ({alignment}) does not divide our 128-row segments")


def _ks_on_device(problem: MoeProblem) -> Any:
    """DeepGEMM's k-grouped grouped_layout: the tokens per expert, int32 on the device."""
    import torch

    return torch.tensor(problem.grouping, dtype=torch.int32, device=problem.device)


def _prepare_deepseek(problem: MoeProblem) -> Prepared:
    case = problem.case
    name = "k_grouped_fp8_gemm_nt_contiguous" if case.kind == "k-grouped" else f"m_grouped_fp8_gemm_nt_{case.kind}"
    module, gemm = deepseek_function(name)
    if case.kind == "k-grouped":
        return _prepare_deepseek_k_grouped(problem, module, gemm)
    if case.kind == "contiguous":
        _require_contiguous_alignment()
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


def _expert_blocks(operand: Any, problem: MoeProblem) -> Any:
    """[rows, K_total] (tokens along K) as DeepGEMM's Hopper k-grouped GEMM takes it: each expert's [rows, k_g] block
    K-major and contiguous, the blocks back to back in one flat tensor (copied once, before timing)."""
    import torch

    raw = operand.view(torch.uint8)  # (FP8 element copies through its bytes)
    blocks = [raw[:, first:first + tokens].reshape(-1) for first, tokens in problem.segments()]
    return torch.cat(blocks).view(operand.dtype)


def _prepare_deepseek_k_grouped(problem: MoeProblem, module: Any, gemm: Any) -> Prepared:
    """DeepGEMM's k_grouped_fp8_gemm_nt_contiguous (its Hopper Wgrad): the same FP8 values and 1 x 128 scales, A and B
    re-laid once per expert block, ks on the device as its grouped_layout, c = d (in place, as ours)."""
    case, out = problem.case, problem.output()
    (a_q, sfa), (b_q, sfb) = problem.a, problem.b
    align = getattr(module, "get_mn_major_tma_aligned_tensor", None)  # its scale layout, made once before timing
    notes = ["C = out (in place)"]
    if align is not None:
        sfa, sfb = align(sfa), align(sfb)
    else:
        notes.append("scales passed as quantize_per_token_group made them (no get_mn_major_tma_aligned_tensor)")
    a, b = (_expert_blocks(a_q, problem), sfa), (_expert_blocks(b_q, problem), sfb)
    ks, ks_tensor = problem.grouping, _ks_on_device(problem)

    def run() -> Any:
        gemm(a, b, out, ks, ks_tensor, out)  # writes `out`, returns nothing
        return out

    notes.append(deepseek.version())
    return Prepared(run, problem.reference, case.hbm_bytes(), "; ".join(notes))


# -- BF16 -------------------------------------------------------------------------------------------------------

def _prepare_deepgemm_bf16(problem: MoeProblem) -> Prepared:
    case, a, b, out = problem.case, problem.a, problem.b, problem.output()
    bytes_ = case.hbm_bytes("bf16")
    if case.kind == "k-grouped":
        ks = problem.grouping

        def run_k() -> Any:  # out += A_g^T B_g: C = out, in place, as gradient accumulation runs it
            return api_bf16_grouped.k_grouped_bf16_gemm_tn_contiguous(a, b, out, ks, c=out)

        return Prepared(run_k, problem.reference, bytes_, "C = out (in place)")
    if case.kind == "contiguous":
        def run() -> Any:
            return api_bf16_grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, out, problem.grouping)
    else:
        def run() -> Any:
            return api_bf16_grouped.m_grouped_bf16_gemm_nt_masked(a, b, out, problem.grouping, case.expected_m)
    return Prepared(run, problem.reference, bytes_, "", _valid_rows(problem))


def _prepare_deepseek_bf16(problem: MoeProblem) -> Prepared:
    case = problem.case
    _, gemm = deepseek_function("k_grouped_bf16_gemm_tn_contiguous" if case.kind == "k-grouped"
                                else f"m_grouped_bf16_gemm_nt_{case.kind}")
    a, b, out = problem.a, problem.b, problem.output()
    select: Callable[[Any], Any] | None = _valid_rows(problem)
    note = deepseek.version()
    if case.kind == "k-grouped":
        extra: tuple[Any, ...] = (problem.grouping, _ks_on_device(problem), out)  # c = d: in place, as ours
        select, note = None, f"C = out (in place); {note}"
    elif case.kind == "contiguous":
        _require_contiguous_alignment()
        extra = (problem.grouping,)
    else:
        extra = (problem.grouping, case.expected_m)

    def run() -> Any:
        gemm(a, b, out, *extra)  # writes `out`, returns nothing
        return out

    return Prepared(run, problem.reference, case.hbm_bytes("bf16"), note, select)


def _prepare_torch_grouped_mm(problem: MoeProblem) -> Prepared:
    """torch._grouped_mm on the same operands: contiguous on the valid rows only (gathered once, offs = segment
    ends), masked over every slot of each group (it has no mask), k-grouped as A^T B with offs along the tokens (no
    C, BF16 out)."""
    import torch

    grouped_mm = getattr(torch, "_grouped_mm", None)
    if grouped_mm is None:
        raise Unavailable(f"this torch ({torch.__version__}) has no torch._grouped_mm")
    case, a, b = problem.case, problem.a, problem.b
    ends = [first + rows for first, rows in problem.segments()]
    if case.kind == "k-grouped":
        a_t = a.t()  # [M, K_total], unit stride along M
        offs = torch.tensor(ends, dtype=torch.int32, device=problem.device)

        def run_k() -> Any:  # BF16 out: its fast path's only output dtype for BF16 operands
            return grouped_mm(a_t, b, offs=offs, out_dtype=torch.bfloat16)

        out_bytes = 2 * case.groups * case.m * case.n
        return Prepared(run_k, problem.product_reference, 2 * case.k * (case.m + case.n) + out_bytes,
                        "no C: writes A_g^T B_g in BF16")
    w_t = b.transpose(-2, -1)
    if case.kind == "contiguous":
        x = a[problem.valid_rows]  # the routed rows back to back, expert by expert (copied before timing)
        offs = torch.tensor(ends, dtype=torch.int32, device=problem.device)

        def run() -> Any:
            return grouped_mm(x, w_t, offs=offs, out_dtype=torch.bfloat16)

        return Prepared(run, problem.reference, case.hbm_bytes("bf16"), "on the routed rows only (no padding)")

    def run_masked() -> Any:
        return grouped_mm(a, w_t)

    return Prepared(run_masked, problem.reference, case.hbm_bytes("bf16"),
                    f"computes all {case.groups}x{case.max_m} rows (no mask)", _valid_rows(problem))


DEEPGEMM_MOE = Implementation("deepgemm", "deepgemm.m_grouped_fp8_gemm_nt_contiguous / _masked (the case's layout), "
                              "k_grouped_fp8_gemm_tn_contiguous (C = out)", "fp8", _prepare_deepgemm, OPERATION)
DEEPSEEK_MOE = Implementation("deepseek-deepgemm", "DeepGEMM (deepseek-ai) deep_gemm.m_grouped_fp8_gemm_nt_contiguous "
                              "/ _masked, k_grouped_fp8_gemm_nt_contiguous (c = d), when installed", "fp8",
                              _prepare_deepseek, OPERATION,
                              missing=deepseek.missing)
MOE_IMPLEMENTATIONS: tuple[Implementation[MoeProblem], ...] = (DEEPGEMM_MOE, DEEPSEEK_MOE)

DEEPGEMM_MOE_BF16 = Implementation("deepgemm-bf16", "deepgemm.m_grouped_bf16_gemm_nt_contiguous / _masked (the case's "
                                   "layout), k_grouped_bf16_gemm_tn_contiguous (C = out)", "bf16",
                                   _prepare_deepgemm_bf16, BF16_OPERATION)
DEEPSEEK_MOE_BF16 = Implementation("deepseek-deepgemm-bf16", "DeepGEMM (deepseek-ai) deep_gemm.m_grouped_bf16_gemm_nt_"
                                   "contiguous / _masked, k_grouped_bf16_gemm_tn_contiguous (C = d), when installed",
                                   "bf16", _prepare_deepseek_bf16, BF16_OPERATION, missing=deepseek.missing)
TORCH_GROUPED_MM = Implementation("torch-grouped-mm", "torch._grouped_mm (contiguous: routed rows only; masked: every "
                                  "slot; k-grouped: no C, BF16 out)", "bf16", _prepare_torch_grouped_mm,
                                  BF16_OPERATION)
MOE_BF16_IMPLEMENTATIONS: tuple[Implementation[MoeProblem], ...] = (DEEPGEMM_MOE_BF16, DEEPSEEK_MOE_BF16,
                                                                    TORCH_GROUPED_MM)


def moe_implementations(precision: Precision) -> tuple[Implementation[MoeProblem], ...]:
    """What an MoE suite run of `precision` times."""
    return MOE_BF16_IMPLEMENTATIONS if precision == "bf16" else MOE_IMPLEMENTATIONS
