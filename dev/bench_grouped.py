"""Grouped FP8 GEMM benchmark on the issue-5 cases (CUDA-graph replay, L2 flushed, median of 30).

Token counts per expert are drawn uniformly in 0.7-1.3x the expected value; FLOPs count valid rows
only; GB/s counts A and D on valid rows plus every expert's weights. Where DeepGEMM (``deep_gemm``) is
installed it runs every case too, timed interleaved with ours (one sample of each per round), with its
scales converted to its layout before timing; its output is checked against ours on the valid rows. The cases and their inputs
(issue5_cases, contiguous_inputs, masked_inputs) are shared with grouped_tile_ab.py.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.helpers, dev.*

import torch  # noqa: E402

import deepgemm  # noqa: E402
from deepgemm.bench import deepseek  # noqa: E402
from deepgemm.tuning.timing import Timing, bench_gpu_interleaved  # noqa: E402
from deepgemm.utils import calc_diff  # noqa: E402
from tests.helpers import random_activations, random_grouped_weights  # noqa: E402

CONTIGUOUS = [(4, 8192, 4096, 7168, 1340), (4, 8192, 7168, 2048, 1190), (8, 4096, 4096, 7168, 1320), (8, 4096, 7168, 2048, 1190)]
MASKED = [(1, 1024, 4096, 4096, 7168, "1050 TFLOPS"), (2, 512, 4096, 4096, 7168, "652 TFLOPS"),
          (4, 256, 4096, 4096, 7168, "669 TFLOPS"), (1, 1024, 4096, 7168, 2048, "574 TFLOPS"),
          (2, 512, 4096, 7168, 2048, "786 TFLOPS"), (4, 256, 4096, 7168, 2048, "620 TFLOPS"),
          (32, 16, 128, 4096, 7168, "3620 GB/s"), (256, 8, 128, 2048, 7168, "3920 GB/s"),
          (64, 32, 128, 7168, 2048, "3650 GB/s"), (8, 64, 128, 4096, 7168, "2520 GB/s")]


def counts_for(groups: int, expected: int, rng: random.Random, cap: int | None = None) -> list[int]:
    return [min(cap or 1 << 30, max(1, round(expected * rng.uniform(0.7, 1.3)))) for _ in range(groups)]


@dataclass(frozen=True)
class ContiguousCase:
    label: str
    groups: int
    counts: list[int]
    n: int
    k: int
    theirs: int  # DeepGEMM TFLOPS (issue 5)

    def m_indices(self) -> list[int]:
        """Each expert's rows, its segment padded with -1 to a multiple of 128 rows."""
        return sum(([g] * c + [-1] * (-(-c // 128) * 128 - c) for g, c in enumerate(self.counts)), [])


@dataclass(frozen=True)
class MaskedCase:
    label: str
    groups: int
    expected: int
    max_m: int
    counts: list[int]
    n: int
    k: int
    theirs: str  # DeepGEMM TFLOPS or GB/s (issue 5)


def issue5_cases(rows_scale: float = 1.0) -> tuple[list[ContiguousCase], list[MaskedCase]]:
    """Every case with its token counts, drawn in one fixed order (a filtered run measures the same counts).
    `rows_scale` multiplies every drawn count (capped at max_m for masked): the same draw moved across the tile
    choice's wave boundaries (e.g. 1.22 turns 1x~1024's 1007 rows into the 1234 of issue 22's table)."""
    rng = random.Random(0)

    def scaled(counts: list[int], cap: int | None = None) -> list[int]:
        return [min(cap or 1 << 30, max(1, round(c * rows_scale))) for c in counts]

    contiguous = [ContiguousCase(f"contiguous {g}x~{e} N={n} K={k}", g, scaled(counts_for(g, e, rng)), n, k, theirs)
                  for g, e, n, k, theirs in CONTIGUOUS]
    masked = [MaskedCase(f"masked {g}x~{e} (max_m {max_m}) N={n} K={k}", g, e, max_m,
                         scaled(counts_for(g, e, rng, cap=max_m), max_m), n, k, theirs) for g, e, max_m, n, k, theirs in MASKED]
    return contiguous, masked


def contiguous_inputs(case: ContiguousCase):  # noqa: ANN201 - (a, b, m_indices) as the API takes them
    m_indices = torch.tensor(case.m_indices(), dtype=torch.int32, device="cuda")
    a = random_activations(m_indices.numel(), case.k, "cuda", 1)
    b = random_grouped_weights(case.groups, case.n, case.k, "cuda", 2)
    return a, b, m_indices


def masked_inputs(case: MaskedCase):  # noqa: ANN201 - (a, b, masked_m) as the API takes them
    """A quantized as one [G * max_m, K] tensor and viewed per group (scales too, as quantize_per_token_group gives)."""
    a2d = random_activations(case.groups * case.max_m, case.k, "cuda", 3)
    a = (a2d[0].view(case.groups, case.max_m, case.k), a2d[1].reshape(case.groups, case.max_m, -1))
    b = random_grouped_weights(case.groups, case.n, case.k, "cuda", 4)
    return a, b, torch.tensor(case.counts, dtype=torch.int32, device="cuda")


def masked_bytes(case: MaskedCase) -> int:
    """A and D on valid rows plus every expert's weights."""
    valid = sum(case.counts)
    return valid * case.k + case.groups * case.n * case.k + valid * case.n * 2


Launch = Callable[[], object]


def _deepseek_available() -> bool:
    reason = deepseek.missing()
    if reason is not None:
        print(f"(DeepGEMM not run: {reason})", file=sys.stderr)
    return reason is None


def _peer_launch(call: str, a, b, out: torch.Tensor, rows: int, k: int, groups: int,  # noqa: ANN001 - (data, scales)
                 *rest: object) -> tuple[tuple[Launch, torch.Tensor] | None, str]:
    """(DeepGEMM's `call` on the same inputs, scales converted to its layout first, into its own output tensor, and
    that tensor; or None and why)."""
    gemm = getattr(deepseek.load(), call, None)
    if gemm is None:
        return None, f"n/a (this DeepGEMM has no {call})"
    masked = call.endswith("masked")
    sfa, _ = deepseek.scales(a[1], rows, k, is_sfa=True, groups=groups if masked else None)
    sfb, _ = deepseek.scales(b[1], b[0].shape[-2], k, is_sfa=False, groups=groups)
    peer_out = torch.empty_like(out)
    pa, pb = (a[0], sfa), (b[0], sfb)
    return ((lambda: gemm(pa, pb, peer_out, *rest)), peer_out), ""


def _time(ours: Launch, theirs: Launch | None) -> tuple[Timing, Timing | None, str]:
    """Ours and DeepGEMM's timed interleaved; if that fails, ours alone and the reason."""
    if theirs is not None:
        try:
            mine, peer = bench_gpu_interleaved([ours, theirs])
            return mine, peer, ""
        except Exception as exc:  # noqa: BLE001 - reported in the row
            reason = f"timing failed: {type(exc).__name__}: {_first_line(exc)}"
            return bench_gpu_interleaved([ours])[0], None, reason
    return bench_gpu_interleaved([ours])[0], None, ""


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:100]


def _row(label: str, t: Timing, flops: int, nbytes: int, issue_figure: str, peer: Timing | None,
         peer_diff: float | None, why_not: str) -> str:
    here = f"{why_not} | —" if peer is None else (
        f"{peer.median_us:.1f} us, {flops / peer.median_us / 1e6:.0f} TFLOPS, {nbytes / peer.median_us / 1e3:.0f} GB/s"
        f" (diff {peer_diff:.1e}) | {peer.median_us / t.median_us:.2f}x")
    return (f"| {label} | {t.median_us:.1f} | {flops / t.median_us / 1e6:.0f} | {nbytes / t.median_us / 1e3:.0f} | "
            f"{issue_figure} | {here} |")


def _measure(ours: Launch, out: torch.Tensor, valid_rows: torch.Tensor, peer: tuple[Launch, torch.Tensor] | None,
             why_not: str) -> tuple[Timing, Timing | None, float | None, str]:
    """(our timing, DeepGEMM's or None, calc_diff of its output against ours on the valid rows, why it is missing)."""
    ours()
    if peer is None:
        return _time(ours, None)[0], None, None, why_not
    theirs, peer_out = peer
    try:
        peer_out.fill_(float("nan"))
        theirs()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported in the row
        return _time(ours, None)[0], None, None, f"error: {type(exc).__name__}: {_first_line(exc)}"
    diff = calc_diff(peer_out[valid_rows].float(), out[valid_rows].float())
    mine, theirs_timing, reason = _time(ours, theirs)
    return mine, theirs_timing, diff, reason


def contiguous_row(case: ContiguousCase, with_peer: bool) -> str:
    a, b, m_indices = contiguous_inputs(case)
    out = torch.empty(m_indices.numel(), case.n, dtype=torch.bfloat16, device="cuda")
    ours = lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices)  # noqa: E731
    peer, why_not = None, "not installed"
    if with_peer:
        alignment = deepseek.m_alignment()
        if alignment is not None and 128 % alignment == 0:  # our 128-row segments suit its layout
            peer, why_not = _peer_launch("m_grouped_fp8_gemm_nt_contiguous", a, b, out, m_indices.numel(), case.k,
                                         case.groups, m_indices)
        else:
            why_not = f"n/a (DeepGEMM's contiguous alignment: {alignment})"
    t, peer_t, diff, why_not = _measure(ours, out, m_indices >= 0, peer, why_not)
    valid = sum(case.counts)
    flops = 2 * valid * case.n * case.k
    nbytes = valid * case.k + case.groups * case.n * case.k + valid * case.n * 2
    return _row(case.label, t, flops, nbytes, f"{case.theirs} TFLOPS", peer_t, diff, why_not)


def masked_row(case: MaskedCase, with_peer: bool) -> str:
    a, b, masked_m = masked_inputs(case)
    out = torch.empty(case.groups, case.max_m, case.n, dtype=torch.bfloat16, device="cuda")
    ours = lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, case.expected)  # noqa: E731
    peer, why_not = _peer_launch("m_grouped_fp8_gemm_nt_masked", a, b, out, case.max_m, case.k, case.groups, masked_m,
                                 case.expected) if with_peer else (None, "not installed")
    rows = torch.arange(case.max_m, device="cuda")[None, :] < masked_m[:, None]
    t, peer_t, diff, why_not = _measure(ours, out, rows, peer, why_not)
    flops = 2 * sum(case.counts) * case.n * case.k
    return _row(case.label, t, flops, masked_bytes(case), case.theirs, peer_t, diff, why_not)


def main() -> None:
    # Optional argument: run only the cases whose label contains it.
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    contiguous, masked = issue5_cases()
    with_peer = _deepseek_available()
    print("| case | us | TFLOPS | GB/s | DeepGEMM (issue 5) | DeepGEMM here, interleaved | theirs/ours time |")
    print("|---|---|---|---|---|---|---|")
    # Each case's tensors are freed and torch's cached segments returned before the next case, so every case
    # runs on freshly mapped memory, as it would alone: carved out of the previous case's freed segments, the
    # masked 64 x ~32 case measured 270 us instead of 250 with the zeroing L2 flush (249 alone, 244 with a
    # reading flush in both placements; docs/performance.md).
    for case in contiguous:
        if only in case.label:
            print(contiguous_row(case, with_peer), flush=True)
            torch.cuda.empty_cache()
    for case in masked:
        if only in case.label:
            print(masked_row(case, with_peer), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
