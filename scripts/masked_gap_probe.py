"""Why does one masked decode case time ~9% slower alone (bench_grouped.py) than interleaved (grouped_tile_ab.py)?

For the cases whose label contains the argument (default: 64 x ~32), with bench_grouped's inputs and token counts,
times in one process: the public API alone (as bench_grouped does), its plan launched directly alone (as
grouped_tile_ab does, but alone), both interleaved, the API alone again, the API into a NaN-filled output, and the
API with the flush buffer allocated before the inputs (a different allocation order). CUDA graph, L2 flushed,
median of 30 each. With --offsets: the same plan on copies of B placed at different byte offsets of one buffer,
interleaved (is the time a function of where the weights lie?). With --after CASE: that case's inputs are
allocated and freed first (as bench_grouped.py runs the cases in turn), with and without emptying torch's cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import deepgemm  # noqa: E402
import deepgemm.kernels.fp8_gemm as fp8_gemm  # noqa: E402
from deepgemm.api.grouped import _masked_sfa_layout, clear_grouped_plans  # noqa: E402
from deepgemm.bench.timing import FLUSH_BYTES, bench_gpu, bench_gpu_interleaved  # noqa: E402
from scripts.bench_grouped import MaskedCase, issue5_cases, masked_bytes, masked_inputs  # noqa: E402


def masked_case(label_part: str) -> MaskedCase:
    """bench_grouped's first masked case whose label contains label_part."""
    for case in issue5_cases()[1]:
        if label_part in case.label:
            return case
    raise SystemExit(f"no masked case matches {label_part!r}")


def build(case: MaskedCase):  # noqa: ANN201 - bench_grouped's inputs and an empty output
    a, b, masked_m = masked_inputs(case)
    return a, b, masked_m, torch.empty(case.groups, case.max_m, case.n, dtype=torch.bfloat16, device="cuda")


def main() -> None:
    args = [v for v in sys.argv[1:] if not v.startswith("--")]
    only = args[0] if args else "64x~32"
    case = masked_case(only)
    label, expected, counts = case.label, case.expected, case.counts
    nbytes = masked_bytes(case)
    print("| case | variant | µs | GB/s | p10 | p90 |")
    print("|---|---|---|---|---|---|")

    def row(name: str, t) -> None:
        print(f"| {label} | {name} | {t.median_us:.1f} | {nbytes / t.median_us / 1e3:.0f} | {t.p10_us:.1f} | "
              f"{t.p90_us:.1f} |", flush=True)

    if "--after" in sys.argv:
        before = masked_case(sys.argv[sys.argv.index("--after") + 1])
        for empty in (False, True):
            first = build(before)
            deepgemm.m_grouped_fp8_gemm_nt_masked(first[0], first[1], first[3], first[2], before.expected)
            torch.cuda.synchronize()
            del first
            if empty:
                torch.cuda.empty_cache()
            a, b, masked_m, out = build(case)
            t = bench_gpu(lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected))
            row(f"after {before.label}{', cache emptied' if empty else ''}: B at {b[0].data_ptr():#x}", t)
            # The same, with L2 evicted by reading a buffer (no dirty lines left to write back during the call).
            clean = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
            t = bench_gpu(lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected),
                          flush=lambda: clean.sum())
            row(f"after {before.label}{', cache emptied' if empty else ''}, read flush", t)
            del clean
            del a, b, masked_m, out
            torch.cuda.empty_cache()
        a, b, masked_m, out = build(case)
        row(f"alone: B at {b[0].data_ptr():#x}",
            bench_gpu(lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected)))
        return

    a, b, masked_m, out = build(case)
    clear_grouped_plans()
    deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected)
    plan = next(iter(fp8_gemm._grouped_plans.values()))
    sfa, sfb = _masked_sfa_layout(a[1]), b[1].contiguous()
    print(f"<!-- {label}: plan {plan.spec.label()}; sfa stride {tuple(a[1].stride())} -> {tuple(sfa.stride())}, "
          f"same storage {sfa.data_ptr() == a[1].data_ptr()} -->", flush=True)

    if "--offsets" in sys.argv:
        offsets = [0, 4096, 65536, 1 << 20, 3 << 20, (1 << 20) + 4096 * 7]
        size = b[0].numel()
        launches, outs = [], []
        for offset in offsets:
            storage = torch.empty(size + offset, dtype=torch.uint8, device="cuda")
            b_view = storage[offset:].view(torch.float8_e4m3fn).view(b[0].shape)
            b_view.copy_(b[0])
            outs.append(torch.empty_like(out))
            launches.append(lambda b_view=b_view, o=outs[-1]: plan.launch(a[0], sfa, b_view, sfb, o, masked_m))
        for offset, t in zip(offsets, bench_gpu_interleaved(launches)):
            row(f"B at offset {offset}", t)
        return

    def api() -> None:
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected)

    out_plan = torch.empty_like(out)

    def direct() -> None:
        plan.launch(a[0], sfa, b[0], sfb, out_plan, masked_m)

    nan_out = torch.full_like(out, float("nan"))

    def api_nan() -> None:
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, nan_out, masked_m, expected)

    row("API alone", bench_gpu(api))
    row("plan.launch alone", bench_gpu(direct))
    both = bench_gpu_interleaved([api, direct])
    row("API, interleaved with plan.launch", both[0])
    row("plan.launch, interleaved with API", both[1])
    row("API alone again", bench_gpu(api))
    row("API alone, NaN-filled out", bench_gpu(api_nan))
    row("API alone, no graph", bench_gpu(api, use_graph=False))
    self_pair = bench_gpu_interleaved([api, api])
    row("API interleaved with itself (1)", self_pair[0])
    row("API interleaved with itself (2)", self_pair[1])
    row("API alone, 100 samples", bench_gpu(api, iters=100))
    torch.testing.assert_close(torch.cat([out[g, :c] for g, c in enumerate(counts)]),
                               torch.cat([out_plan[g, :c] for g, c in enumerate(counts)]), rtol=0, atol=0)


if __name__ == "__main__":
    main()
