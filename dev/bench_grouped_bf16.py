"""Grouped BF16 GEMM benchmark: the issue-5 grouped cases in BF16, against DeepGEMM HEAD and torch._grouped_mm.

Forms: m-grouped contiguous (m_indices, and the psum form as a second column of ours), m-grouped masked and
k-grouped contiguous (expert weight gradient, FP32 out accumulated in place). Timing as dev/bench_grouped.py:
deepgemm.tuning.timing.bench_gpu_interleaved (CUDA-graph replay, L2 flushed before every sample, median of 30),
ours and every peer timed interleaved sample by sample on the same inputs. Before timing each peer runs once and
its output is checked against ours on the valid rows with deepgemm.utils.calc_diff.

Peers (each skipped with the reason in its cell where it is missing or raises):
- DeepGEMM HEAD (`deep_gemm`, after `. .peers/use_deepgemm.sh`): m_grouped_bf16_gemm_nt_contiguous(a, b, d,
  m_indices), m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m) and
  k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, ks_tensor, c) with c = d (in place; it requires c).
- torch._grouped_mm: contiguous 2D x 3D on the valid rows only (no padding, offs = cumulative row ends); masked
  3D x 3D over all max_m rows (it has no mask, so it computes every row); k-grouped 2D x 2D with offs along K
  (no C: it writes A^T B, in BF16 where it refuses out_dtype=float32).

FLOPs count valid rows only (masked: sum(masked_m), also for torch, which computes all rows). Token counts are
drawn uniformly in 0.7-1.3x the expected count with --seed (0: the same counts as dev/bench_grouped.py), k-grouped
ks rounded to multiples of 128. Inputs are random BF16 with per-row magnitudes, never zeros (the recipe of
tests.helpers.random_activations / random_grouped_weights before their FP8 quantization, drawn on the GPU).

`deepgemm bench --suite deepseek-v3-moe --dtype bf16` times the same cases and counts (stored and comparable like
every suite; no psum column).

Usage: python3 dev/bench_grouped_bf16.py [--only contiguous|masked|kgrouped] [--quick] [--seed S] [--json PATH]
The Markdown table is printed last; progress lines go to stderr; --json is rewritten after every case.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: dev.*

import torch

import deepgemm
from deepgemm.bench import deepseek
from deepgemm.tuning.timing import Timing, bench_gpu_interleaved
from deepgemm.utils import calc_diff
from dev.bench_grouped import CONTIGUOUS, MASKED, counts_for

# (groups, expected tokens per group, M, N): the expert weight gradient dW_g = dY_g^T X_g
KGROUPED = [(4, 4096, 4096, 4096), (4, 4096, 7168, 7168), (8, 4096, 4096, 4096), (8, 4096, 7168, 7168)]
DEVICE = "cuda"
K_ALIGNMENT = 128  # every k-grouped segment is a multiple of 128 tokens
KINDS = ("contiguous", "masked", "kgrouped")

OURS, PSUM, DEEPGEMM, TORCH = "ours", "ours psum", "DeepGEMM", "torch._grouped_mm"
PEERS = (DEEPGEMM, TORCH)

Launch = Callable[[], object]


@dataclass(frozen=True)
class Case:
    kind: str  # one of KINDS
    label: str
    groups: int
    counts: tuple[int, ...]  # valid rows per group (contiguous, masked) or ks, tokens per group (kgrouped)
    n: int
    k: int  # K; for kgrouped K_total = sum(counts)
    m: int = 0  # kgrouped: M
    max_m: int = 0  # masked: rows per group in A and out
    expected: int = 0  # expected rows (tokens) per group

    @property
    def flops(self) -> int:
        rows = self.m if self.kind == "kgrouped" else sum(self.counts)
        return 2 * rows * self.n * self.k


@dataclass
class Impl:
    """One implementation of a case: `launch` is what is timed; `check` runs it once and returns what is compared
    with ours (float32; the valid rows, or A^T B for kgrouped). No launch: `missing` says why."""

    name: str
    launch: Launch | None = None
    check: Callable[[], torch.Tensor] | None = None
    missing: str = ""
    caveat: str = ""


def build_cases(seed: int) -> list[Case]:
    """Every case with its counts, drawn in one fixed order (contiguous, masked, kgrouped), so a filtered run
    measures the same counts; seed 0 gives dev/bench_grouped.py's contiguous and masked counts."""
    rng = random.Random(seed)
    cases = [Case("contiguous", f"contiguous {g}x~{e} N={n} K={k}", g, tuple(counts_for(g, e, rng)), n, k, expected=e)
             for g, e, n, k, _ in CONTIGUOUS]
    cases += [Case("masked", f"masked {g}x~{e} (max_m {max_m}) N={n} K={k}", g, tuple(counts_for(g, e, rng, cap=max_m)),
                   n, k, max_m=max_m, expected=e) for g, e, max_m, n, k, _ in MASKED]
    for g, e, m, n in KGROUPED:
        ks = tuple(K_ALIGNMENT * max(1, round(e * rng.uniform(0.7, 1.3) / K_ALIGNMENT)) for _ in range(g))
        cases.append(Case("kgrouped", f"k-grouped {g}x~{e} M={m} N={n}", g, ks, n, sum(ks), m=m, expected=e))
    return cases


def random_bf16(shape: tuple[int, ...], seed: int, row_sigma: float) -> torch.Tensor:
    """BF16 N(0, 1) times a per-row magnitude exp(N(0, row_sigma)) (rows: all but the last dimension), as
    tests.helpers draws its FP8 inputs before quantizing (it has no BF16 generator); drawn on the GPU (seeded)."""
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(seed)
    x = torch.randn(shape, generator=gen, device=DEVICE, dtype=torch.float32)
    x.mul_(torch.randn((*shape[:-1], 1), generator=gen, device=DEVICE, dtype=torch.float32).mul_(row_sigma).exp_())
    return x.to(torch.bfloat16)


def _short(exc: BaseException) -> str:
    """The exception's type and first line, fit for a Markdown cell."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:100]}".replace("|", "/")


class _Stopped(BaseException):
    """SIGTERM (the step's timeout): the rows measured so far are still printed."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopped


def _grouped_mm() -> tuple[Any, str]:
    """(torch._grouped_mm or None, why it is missing)."""
    gm = getattr(torch, "_grouped_mm", None)
    return gm, "" if gm is not None else f"unavailable (torch {torch.__version__} has no torch._grouped_mm)"


def _rows_impl(name: str, call: Callable[[], Any] | None, out: torch.Tensor | None, rows: Any,
               missing: str = "", caveat: str = "") -> Impl:
    """An m-grouped implementation writing `out` (None: the tensor `call` returns), compared on out[rows]."""
    if call is None:
        return Impl(name, missing=missing)

    def check() -> torch.Tensor:
        if out is not None:
            out.fill_(float("nan"))  # a valid row left unwritten shows as NaN in the diff
        result = call()
        return (out if out is not None else result)[rows].float()

    return Impl(name, call, check, caveat=caveat)


def _peer_fn(peer: Any, name: str) -> tuple[Any, str]:
    """(DeepGEMM's function `name`, or None and why)."""
    if peer is None:
        return None, "not installed"
    fn = getattr(peer, name, None)
    return fn, "" if fn is not None else f"n/a (this DeepGEMM has no {name})"


def _ours_fn(name: str) -> tuple[Any, str]:
    fn = getattr(deepgemm, name, None)
    return fn, "" if fn is not None else f"n/a (this deepgemm has no {name})"


def contiguous_m_indices(counts: tuple[int, ...]) -> list[int]:
    """The m_indices of experts with these row counts, each segment padded with -1 to the contiguous alignment."""
    align = deepgemm.get_m_alignment_for_contiguous_layout()
    m_indices: list[int] = []
    for g, c in enumerate(counts):
        m_indices += [g] * c + [-1] * (-(-c // align) * align - c)
    return m_indices


def contiguous_impls(case: Case, seed: int, peer: Any, peer_alignment: int | None) -> list[Impl]:
    align = deepgemm.get_m_alignment_for_contiguous_layout()
    padded = [-(-c // align) * align for c in case.counts]
    m_indices_host = contiguous_m_indices(case.counts)
    starts = [sum(padded[:g]) for g in range(case.groups)]
    m_total = len(m_indices_host)
    m_indices = torch.tensor(m_indices_host, dtype=torch.int32, device=DEVICE)
    psum = torch.tensor([s + c for s, c in zip(starts, case.counts)], dtype=torch.int32, device=DEVICE)
    a = random_bf16((m_total, case.k), seed + 1, 1.0)
    b = random_bf16((case.groups, case.n, case.k), seed + 2, 0.5)
    valid = m_indices >= 0
    impls = []

    ours, why = _ours_fn("m_grouped_bf16_gemm_nt_contiguous")
    out = torch.empty(m_total, case.n, dtype=torch.bfloat16, device=DEVICE)
    impls.append(_rows_impl(OURS, ours and (lambda: ours(a, b, out, m_indices)), out, valid, why))

    ours_psum, why = _ours_fn("m_grouped_bf16_gemm_nt_contiguous_psum")
    out_psum = torch.empty_like(out)
    impls.append(_rows_impl(PSUM, ours_psum and (lambda: ours_psum(a, b, out_psum, psum)), out_psum, valid, why))

    dg, why = _peer_fn(peer, "m_grouped_bf16_gemm_nt_contiguous")
    if dg is not None and (peer_alignment is None or align % peer_alignment != 0):
        dg, why = None, f"n/a (DeepGEMM's contiguous alignment: {peer_alignment})"
    peer_out = torch.empty_like(out)
    impls.append(_rows_impl(DEEPGEMM, dg and (lambda: dg(a, b, peer_out, m_indices)), peer_out, valid, why))

    gm, why = _grouped_mm()
    if gm is not None:
        x = a[valid]  # only the valid rows, grouped by expert (a copy made before timing)
        offs = torch.tensor(psum_of(case.counts), dtype=torch.int32, device=DEVICE)
        w_t = b.transpose(-2, -1)
        impls.append(_rows_impl(TORCH, lambda: gm(x, w_t, offs=offs, out_dtype=torch.bfloat16), None, slice(None)))
    else:
        impls.append(Impl(TORCH, missing=why))
    return impls


def psum_of(counts: tuple[int, ...]) -> list[int]:
    """Cumulative ends of back-to-back segments (no padding)."""
    ends, total = [], 0
    for c in counts:
        total += c
        ends.append(total)
    return ends


def masked_impls(case: Case, seed: int, peer: Any) -> list[Impl]:
    a = random_bf16((case.groups * case.max_m, case.k), seed + 3, 1.0).view(case.groups, case.max_m, case.k)
    b = random_bf16((case.groups, case.n, case.k), seed + 4, 0.5)
    masked_m = torch.tensor(case.counts, dtype=torch.int32, device=DEVICE)
    rows = torch.arange(case.max_m, device=DEVICE)[None, :] < masked_m[:, None]
    impls = []

    ours, why = _ours_fn("m_grouped_bf16_gemm_nt_masked")
    out = torch.empty(case.groups, case.max_m, case.n, dtype=torch.bfloat16, device=DEVICE)
    impls.append(_rows_impl(OURS, ours and (lambda: ours(a, b, out, masked_m, case.expected)), out, rows, why))

    dg, why = _peer_fn(peer, "m_grouped_bf16_gemm_nt_masked")
    peer_out = torch.empty_like(out)
    impls.append(_rows_impl(DEEPGEMM, dg and (lambda: dg(a, b, peer_out, masked_m, case.expected)), peer_out, rows,
                            why))

    gm, why = _grouped_mm()
    w_t = b.transpose(-2, -1)
    impls.append(_rows_impl(TORCH, gm and (lambda: gm(a, w_t)), None, rows, why,
                            caveat=f"computes all {case.groups}x{case.max_m} rows (no mask)"))
    return impls


def kgrouped_impls(case: Case, seed: int, peer: Any) -> list[Impl]:
    """Timed: out = out + A^T B in place (ours, DeepGEMM). Checked: out = c0 + A^T B with a random c0, compared as
    out - c0 (torch: its A^T B)."""
    ks = list(case.counts)
    a = random_bf16((case.k, case.m), seed + 5, 1.0)  # dY [K_total, M], token-major
    b = random_bf16((case.k, case.n), seed + 6, 1.0)  # X [K_total, N]
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(seed + 7)
    c0 = torch.randn(case.groups, case.m, case.n, generator=gen, device=DEVICE, dtype=torch.float32)
    impls = []

    ours, why = _ours_fn("k_grouped_bf16_gemm_tn_contiguous")
    out = torch.empty(case.groups, case.m, case.n, dtype=torch.float32, device=DEVICE)
    if ours is None:
        impls.append(Impl(OURS, missing=why))
    else:
        def ours_check() -> torch.Tensor:
            ours(a, b, out, ks, c=c0)
            return out - c0

        impls.append(Impl(OURS, lambda: ours(a, b, out, ks, c=out), ours_check))

    dg, why = _peer_fn(peer, "k_grouped_bf16_gemm_tn_contiguous")
    if dg is None:
        impls.append(Impl(DEEPGEMM, missing=why))
    else:
        ks_tensor = torch.tensor(ks, dtype=torch.int32, device=DEVICE)  # its grouped_layout: ks on the device
        peer_out = torch.empty_like(out)

        def dg_check() -> torch.Tensor:
            dg(a, b, peer_out, ks, ks_tensor, c0)
            return peer_out - c0

        impls.append(Impl(DEEPGEMM, lambda: dg(a, b, peer_out, ks, ks_tensor, peer_out), dg_check))

    gm, why = _grouped_mm()
    if gm is None:
        impls.append(Impl(TORCH, missing=why))
        return impls
    a_t = a.t()  # [M, K_total], unit stride along M
    offs = torch.tensor(psum_of(case.counts), dtype=torch.int32, device=DEVICE)
    try:
        gm(a_t, b, offs=offs, out_dtype=torch.float32)
        torch.cuda.synchronize()
        out_dtype, caveat = torch.float32, "FP32 out, no C"
    except Exception as exc:  # noqa: BLE001 - refused: BF16 out, said in the row
        out_dtype, caveat = torch.bfloat16, f"BF16 out (out_dtype=float32 refused: {_short(exc)}), no C"

    def torch_launch() -> torch.Tensor:
        return gm(a_t, b, offs=offs, out_dtype=out_dtype)

    impls.append(Impl(TORCH, torch_launch, lambda: torch_launch().float(), caveat=caveat))
    return impls


def _time(launches: list[Launch]) -> tuple[list[Timing | None], list[str]]:
    """All launches interleaved; if that fails, each alone to find those that fail, the rest interleaved again."""
    try:
        return list(bench_gpu_interleaved(launches)), [""] * len(launches)
    except Exception as exc:  # noqa: BLE001 - reported in the rows
        first = _short(exc)
    torch.cuda.synchronize()
    alone: list[Timing | None] = []
    reasons = []
    for fn in launches:
        try:
            alone.append(bench_gpu_interleaved([fn])[0])
            reasons.append("")
        except Exception as exc:  # noqa: BLE001 - reported in the row
            torch.cuda.synchronize()
            alone.append(None)
            reasons.append(f"unavailable: timing failed: {_short(exc)}")
    ok = [i for i, t in enumerate(alone) if t is not None]
    try:
        again = bench_gpu_interleaved([launches[i] for i in ok]) if ok else []
        for i, t in zip(ok, again):
            alone[i] = t
    except Exception:  # noqa: BLE001 - the lone timings stay, said in the rows
        for i in ok:
            reasons[i] = f"timed alone (interleaved timing failed: {first})"
    return alone, reasons


def measure(case: Case, impls: list[Impl]) -> dict[str, dict[str, Any]]:
    """Each implementation run once and checked against ours, then all timed interleaved."""
    results: dict[str, dict[str, Any]] = {
        impl.name: {"us": None, "tflops": None, "p10_us": None, "p90_us": None, "graph": None, "diff": None,
                    "missing": impl.missing, "caveat": impl.caveat} for impl in impls}
    live: list[Impl] = []
    reference = None
    for impl in impls:  # ours first
        if impl.launch is None or impl.check is None:
            continue
        try:
            got = impl.check()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported in the row
            torch.cuda.synchronize()
            results[impl.name]["missing"] = f"unavailable: {_short(exc)}"
            continue
        if impl.name == OURS:
            reference = got
        elif reference is not None:
            results[impl.name]["diff"] = calc_diff(got, reference)
        del got
        live.append(impl)
    del reference
    if not live:
        return results
    timings, reasons = _time([impl.launch for impl in live if impl.launch is not None])
    for impl, timing, reason in zip(live, timings, reasons):
        result = results[impl.name]
        if reason:
            key = "missing" if timing is None else "caveat"
            result[key] = "; ".join(filter(None, [result[key], reason]))
        if timing is None:
            continue
        result.update(us=timing.median_us, tflops=case.flops / timing.median_us / 1e6, p10_us=timing.p10_us,
                      p90_us=timing.p90_us, graph=timing.graph)
        if not timing.graph:
            result["caveat"] = "; ".join(filter(None, [result["caveat"], "eager (CUDA-graph capture failed)"]))
    return results


def run_case(case: Case, seed: int, peer: Any, peer_alignment: int | None) -> dict[str, Any]:
    if case.kind == "contiguous":
        impls = contiguous_impls(case, seed, peer, peer_alignment)
    elif case.kind == "masked":
        impls = masked_impls(case, seed, peer)
    else:
        impls = kgrouped_impls(case, seed, peer)
    results = measure(case, impls)
    del impls
    row: dict[str, Any] = {"kind": case.kind, "label": case.label, "groups": case.groups, "counts": list(case.counts),
                           "m": case.m, "n": case.n, "k": case.k, "max_m": case.max_m, "expected": case.expected,
                           "flops": case.flops, "results": results, "best_peer": None,
                           "best_peer_us_over_ours_us": None, "error": None}
    ours_us = results[OURS]["us"]
    timed = [(results[p]["us"], p) for p in PEERS if results.get(p, {}).get("us") is not None]
    if timed:
        best_us, best = min(timed)
        row["best_peer"] = best
        if ours_us is not None:
            row["best_peer_us_over_ours_us"] = best_us / ours_us
    return row


def _us(result: dict[str, Any] | None) -> str:
    if result is None:
        return "—"
    return f"{result['us']:.1f}" if result["us"] is not None else (result["missing"] or "—")


def _tflops(result: dict[str, Any] | None) -> str:
    return f"{result['tflops']:.0f}" if result is not None and result["tflops"] is not None else "—"


def _diff(result: dict[str, Any] | None) -> str:
    return f"{result['diff']:.1e}" if result is not None and result["diff"] is not None else "—"


HEADER = ("| case | ours us | ours TFLOPS | ours psum us (diff) | DeepGEMM us | DeepGEMM TFLOPS | DeepGEMM diff | "
          "torch us | torch TFLOPS | torch diff | best peer us / ours us | notes |")


def table_row(row: dict[str, Any]) -> str:
    if row["error"]:
        return f"| {row['label']} | {row['error']} |" + " — |" * 10
    res = row["results"]
    ours, psum, dg, tm = res.get(OURS), res.get(PSUM), res.get(DEEPGEMM), res.get(TORCH)
    psum_cell = "—" if psum is None else (f"{_us(psum)} ({_diff(psum)})" if psum["us"] is not None else _us(psum))
    ratio = row["best_peer_us_over_ours_us"]
    ratio_cell = f"{ratio:.2f}x ({row['best_peer']})" if ratio is not None else "—"
    notes = "; ".join(f"{name}: {r['caveat']}" for name, r in res.items() if r["caveat"])
    return (f"| {row['label']} | {_us(ours)} | {_tflops(ours)} | {psum_cell} | {_us(dg)} | {_tflops(dg)} | "
            f"{_diff(dg)} | {_us(tm)} | {_tflops(tm)} | {_diff(tm)} | {ratio_cell} | {notes or '—'} |")


def _progress(row: dict[str, Any]) -> str:
    if row["error"]:
        return f"{row['label']}: {row['error']}"
    parts = [f"{name} {_us(r)}" + (" us" if r["us"] is not None else "") for name, r in row["results"].items()]
    return f"{row['label']}: " + ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=KINDS, help="run only this kind of case")
    parser.add_argument("--quick", action="store_true", help="one case per kind")
    parser.add_argument("--seed", type=int, default=0, help="seed of the token counts and inputs (default 0)")
    parser.add_argument("--json", type=Path, help="write the rows here (rewritten after every case)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_grouped_bf16: no CUDA device")

    cases = [c for c in build_cases(args.seed) if args.only in (None, c.kind)]
    if args.quick:
        cases = [next(c for c in cases if c.kind == kind) for kind in KINDS if any(c.kind == kind for c in cases)]
    peer_reason = deepseek.missing()
    peer = deepseek.load() if peer_reason is None else None
    peer_alignment = deepseek.m_alignment() if peer is not None else None
    peer_line = deepseek.version() if peer is not None else f"not run ({peer_reason})"
    meta = {"seed": args.seed, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "deepgemm_peer": peer_line, "grouped_mm": hasattr(torch, "_grouped_mm"),
            "timing": "bench_gpu_interleaved: CUDA-graph replay, L2 flushed, median of 30, interleaved"}
    print(f"BF16 grouped GEMM: seed {args.seed}, {meta['device']}, torch {torch.__version__}, DeepGEMM: {peer_line}",
          file=sys.stderr, flush=True)

    rows: list[dict[str, Any]] = []
    stopped = ""
    signal.signal(signal.SIGTERM, _stop)
    try:
        for case in cases:
            print(f"{case.label}: running", file=sys.stderr, flush=True)
            try:
                row = run_case(case, args.seed, peer, peer_alignment)
            except Exception as exc:  # noqa: BLE001 - one failing case (e.g. out of memory) leaves the others
                row = {"kind": case.kind, "label": case.label, "groups": case.groups, "counts": list(case.counts),
                       "error": f"failed: {_short(exc)}"}
            rows.append(row)
            print(_progress(row), file=sys.stderr, flush=True)
            torch.cuda.empty_cache()  # each case on freshly mapped memory, as in dev/bench_grouped.py
            if args.json is not None:  # written whole, then moved in place: a timeout never leaves half a file
                partial = args.json.with_name(args.json.name + ".partial")
                partial.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
                partial.replace(args.json)
    except _Stopped:
        stopped = f"STOPPED by SIGTERM after {len(rows)} of {len(cases)} cases. "

    print(f"\n{stopped}BF16 grouped GEMM, seed {args.seed} (token counts 0.7-1.3x expected), {meta['device']}, "
          f"torch {torch.__version__}, DeepGEMM: {peer_line}.")
    print("Times: median us of 30 CUDA-graph replays, L2 flushed, all columns interleaved sample by sample on the same "
          "inputs. TFLOPS on valid rows only. diff: calc_diff against ours on the valid rows (k-grouped: A^T B). "
          "best peer us / ours us > 1: ours faster. k-grouped: ours and DeepGEMM accumulate into FP32 C = D in place; "
          "torch._grouped_mm writes A^T B without C.\n")
    print(HEADER)
    print("|" + "---|" * 12)
    for row in rows:
        print(table_row(row))
    if stopped:
        sys.exit(1)


if __name__ == "__main__":
    main()
