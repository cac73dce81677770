"""Trees of deepgemm in one process, timed interleaved on the same inputs (a refactor must not move the numbers).

  python dev/ab_trees.py OLD_PACKAGE [OTHER ...] [--only SUB,SUB] [--m M,M] [--more]
                                        e.g. deepgemm_old: another tree's package, renamed (dev/rename_package.sh);
                                        several packages (variants) are timed together; --only keeps the cases
                                        whose label contains one of the substrings; --m adds dense
                                        cases at these M for the suite's (N, K); --more adds the
                                        k-grouped FP8 / BF16 Wgrad cases, BF16 contiguous and masked,
                                        and dense BF16 (NT, TN; NN too below one M-block);
                                        every tree's FP8 kernels are compiled first, all cores at once
                                        (--compile-only: only that, no GPU needed)

The 18 DeepSeek-V3 dense shapes and the grouped (contiguous, masked) cases of dev/bench_grouped.py: every tree's
public calls on the same operands, outputs compared bitwise on the rows the call defines (against this tree's),
then timed interleaved sample by sample (CUDA-graph replay, L2 flushed, median of 30). Prints a Markdown table:
µs per tree and each other tree's time over this tree's; then per tree and case class (dense M <= 128, dense M >= 256,
contiguous, masked, the --more cases) the geometric mean, min and max of those ratios and whether every output matched.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import deepgemm  # noqa: E402
from deepgemm.bench.suites import suite_shapes  # noqa: E402
from deepgemm.tuning.timing import FLUSH_MODES, FlushMode, bench_gpu_interleaved  # noqa: E402

from dev.bench_grouped import contiguous_inputs, issue5_cases, masked_inputs  # noqa: E402
from dev.bench_kgrouped import fp8_operands, group_tokens  # noqa: E402
from tests.helpers import random_operands  # noqa: E402

FLUSH_MODE: list[FlushMode] = ["zero"]  # the L2 flush --flush picked


# (case class, other trees' time / this tree's, whether each one's output is bitwise this tree's) per timed row, for
# the summary.
RESULTS: list[tuple[str, list[float], list[bool]]] = []


def case_class(label: str) -> str:
    """The summary's classes: dense decode (M <= 128), dense M >= 256, contiguous, masked, the rest (--more)."""
    if label.startswith("contiguous") or label.startswith("masked"):
        return label.split()[0]
    head = label.split("x")[0]
    if head.isdigit():
        return "dense M <= 128" if int(head) <= 128 else "dense M >= 256"
    return "more"


def row(label: str, calls: list, outs: list[torch.Tensor], valid: torch.Tensor | None, flops: int) -> str:  # noqa: ANN001
    for call in calls:
        call()
    torch.cuda.synchronize()
    same = [torch.equal(out[valid], outs[0][valid]) if valid is not None else torch.equal(out, outs[0]) for out in outs[1:]]
    times = [t.median_us for t in bench_gpu_interleaved(calls, flush_mode=FLUSH_MODE[0])]
    RESULTS.append((case_class(label), [t / times[0] for t in times[1:]], same))
    cells = [f"{t:.1f}" for t in times] + [f"{t / times[0]:.3f}" for t in times[1:]]
    return (f"| {label} | {' | '.join(cells)} | {flops / times[0] / 1e6:.0f} | "
            f"{'yes' if all(same) else 'NO'} |")


def summary(names: list[str]) -> None:
    """Per other tree and case class: geometric mean, min and max of its time over this tree's (below 1: faster),
    and whether every output was bitwise this tree's."""
    import math

    classes = list(dict.fromkeys(cls for cls, _, _ in RESULTS))
    print()
    print("| tree | class | cases | geomean other / this | min | max | outputs |")
    print("|---|---|---|---|---|---|---|")
    for i, name in enumerate(names):
        for cls in classes + ["all"]:
            picked = [(r[i], same[i]) for c, r, same in RESULTS if cls in ("all", c)]
            if not picked:
                continue
            ratios = [ratio for ratio, _ in picked]
            geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            outputs = "bitwise" if all(same for _, same in picked) else "DIFFER"
            print(f"| {name} | {cls} | {len(ratios)} | {geomean:.3f} | {min(ratios):.3f} | {max(ratios):.3f} | "
                  f"{outputs} |")


def main() -> None:
    parser = argparse.ArgumentParser(description="time other trees' packages against this one, interleaved")
    parser.add_argument("packages", nargs="*", default=["deepgemm_old"])
    parser.add_argument("--only", type=lambda text: text.split(","), default=None)
    parser.add_argument("--m", type=lambda text: [int(m) for m in text.split(",")], default=[])
    parser.add_argument("--more", action="store_true")
    parser.add_argument("--flush", choices=FLUSH_MODES, default="zero",
                        help="L2 flush before each sample: zero a 256 MiB buffer (the bench's; leaves dirty lines) or "
                             "read it (leaves clean lines, as a previous GEMM's weight reads do)")
    parser.add_argument("--compile-only", action="store_true", help="only compile every tree's kernels (no GPU needed)")
    args = parser.parse_args()
    names, only, extra_m, more, compile_only = args.packages, args.only, args.m, args.more, args.compile_only
    FLUSH_MODE[0] = args.flush
    trees = [deepgemm] + [importlib.import_module(name) for name in names]
    print(f"this tree: {Path(deepgemm.__file__).parent}; others: {', '.join(names)}")

    def keep(label: str) -> bool:
        return only is None or any(sub in label for sub in only)

    shapes = list(suite_shapes("deepseek-v3"))
    shapes += [(m, n, k) for m in extra_m for n, k in dict.fromkeys((n, k) for _, n, k in shapes)]
    shapes = [(m, n, k) for m, n, k in shapes if keep(f"{m}x{n}x{k}")]
    contiguous, masked = issue5_cases()
    contiguous = [case for case in contiguous if keep(case.label)]
    masked = [case for case in masked if keep(case.label)]
    precompile(trees, shapes, contiguous, masked)
    if compile_only:
        return
    print(f"| case | this µs | {' | '.join(f'{n} µs' for n in names)} | {' | '.join(f'{n} / this' for n in names)} | "
          f"this TFLOPS | same output |")
    print("|---|" + "---|" * (2 * len(names) + 3))
    for m, n, k in shapes:
        a, b = random_operands(m, n, k, "cuda")
        outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in trees]
        calls = [lambda t=t, o=o: t.fp8_gemm_nt(a, b, o) for t, o in zip(trees, outs)]
        print(row(f"{m}x{n}x{k}", calls, outs, None, 2 * m * n * k), flush=True)
    for case in contiguous:
        a, b, m_indices = contiguous_inputs(case)
        outs = [torch.empty(m_indices.numel(), case.n, dtype=torch.bfloat16, device="cuda") for _ in trees]
        calls = [lambda t=t, o=o: t.m_grouped_fp8_gemm_nt_contiguous(a, b, o, m_indices) for t, o in zip(trees, outs)]
        print(row(case.label, calls, outs, None, 2 * sum(case.counts) * case.n * case.k), flush=True)
    for case in masked:
        a, b, masked_m = masked_inputs(case)
        outs = [torch.empty(case.groups, case.max_m, case.n, dtype=torch.bfloat16, device="cuda") for _ in trees]
        valid = torch.arange(case.max_m, device="cuda")[None, :] < masked_m[:, None]
        calls = [lambda t=t, o=o: t.m_grouped_fp8_gemm_nt_masked(a, b, o, masked_m, case.expected)
                 for t, o in zip(trees, outs)]
        print(row(case.label, calls, outs, valid, 2 * sum(case.counts) * case.n * case.k), flush=True)

    if more:
        more_cases(trees, keep)
    summary(names)


def precompile(trees: list, shapes: list, contiguous: list, masked: list) -> None:  # noqa: ANN001 - modules, cases
    """Every tree's FP8 kernels of the dense and grouped cases, compiled before any timing, all cores at a time
    (the cases would otherwise compile one kernel at a time on their first call)."""
    import time

    start = time.perf_counter()
    counts = []
    for tree in trees:
        api = importlib.import_module(f"{tree.__name__}.api.precompile")
        target = api.local_target()
        specs = [api.dense_kernel(m, n, k, torch.bfloat16, target) for m, n, k in shapes]
        specs += [api.contiguous_kernel(len(case.m_indices()), case.groups, case.n, case.k, torch.bfloat16, target)
                  for case in contiguous]
        specs += [api.masked_kernel(case.expected, case.max_m, case.groups, case.n, case.k, torch.bfloat16, target)
                  for case in masked]
        summary = api.compile_sources(api.unique_sources(specs))
        counts.append(f"{tree.__name__} {summary.kernels} ({summary.compiled} compiled)")
    print(f"precompiled in {time.perf_counter() - start:.1f} s: {', '.join(counts)}", flush=True)


# Dense BF16 shapes of --more: the M = 4096 suite shapes, and decode, mid-M and large-M shapes whose tile picks are
# near ties in the BF16 cost model.
BF16_DENSE = ((4096, 7168, 2048), (4096, 4096, 7168), (4096, 2112, 7168), (4096, 7168, 16384), (4096, 24576, 1536),
              (4096, 32768, 512), (4096, 28672, 512), (32768, 4096, 7168), (8192, 8192, 8192),
              (2048, 7168, 2048), (2048, 8192, 8192), (512, 4096, 7168), (256, 4096, 7168), (256, 7168, 2048),
              (128, 4096, 7168), (128, 7168, 2048), (64, 4096, 7168))
# Decode sizes below one 64-row block and partial last M-blocks (a K-major A's last-block box), also in NN.
BF16_SMALL_M = ((1, 4096, 14336), (16, 4096, 14336), (32, 4096, 7168), (1, 7168, 2048), (16, 2112, 7168),
                (8, 8192, 8192), (16, 28672, 4096), (100, 4096, 7168), (200, 7168, 2048))
BF16_DENSE_CASES = ([(layout, m, n, k) for layout in ("nt", "tn") for m, n, k in BF16_DENSE]
                    + [(layout, m, n, k) for layout in ("nt", "nn", "tn") for m, n, k in BF16_SMALL_M
                       if layout[0] == "n" or m % 8 == 0])  # an MN-major A needs M % 8 == 0


def precompile_bf16(trees: list, cases: list[tuple[str, int, int, int]]) -> None:  # noqa: ANN001 - modules
    """Every tree's dense BF16 kernels of `cases` (layout, m, n, k; BF16 out, no C) compiled at once, all cores."""
    for tree in trees:
        api = importlib.import_module(f"{tree.__name__}.api.precompile")
        plan = importlib.import_module(f"{tree.__name__}.kernels.sm90_bf16_gemm.plan")
        spec = importlib.import_module(f"{tree.__name__}.kernels.sm90_bf16_gemm.spec")
        sms = api.local_target().num_sms
        sources = [spec.render_source(plan.bf16_spec(m, n, k, layout, torch.bfloat16, None, sms)) for layout, m, n, k in cases]
        print(f"{tree.__name__}: {api.compile_sources(list(dict.fromkeys(sources)))}", flush=True)


def more_cases(trees: list, keep) -> None:  # noqa: ANN001 - modules, a label filter
    """k-grouped FP8 (C = out, FP32) and BF16 (C = out) Wgrad, BF16 contiguous and masked (the FP8 cases' counts), and
    dense BF16 NT / TN into BF16."""
    rng = random.Random(0)
    for groups, tokens, m, n in ((4, 8192, 4096, 7168), (8, 4096, 7168, 2048)):
        ks = group_tokens(groups, tokens, rng)
        flops = 2 * m * n * sum(ks)
        label = f"fp8 k-grouped {groups}x~{tokens} {m}x{n}"
        if keep(label):
            a, b = fp8_operands(m, n, sum(ks))
            c = torch.randn(groups, m, n, device="cuda")
            outs = [c.clone() for _ in trees]
            calls = [lambda t=t, o=o: t.k_grouped_fp8_gemm_tn_contiguous(a, b, o, ks, c=o) for t, o in zip(trees, outs)]
            print(row(label, calls, outs, None, flops), flush=True)
        label = f"bf16 k-grouped {groups}x~{tokens} {m}x{n}"
        if keep(label):
            dy = torch.randn(sum(ks), m, device="cuda").to(torch.bfloat16)
            x = torch.randn(sum(ks), n, device="cuda").to(torch.bfloat16)
            c = torch.randn(groups, m, n, device="cuda")
            outs = [c.clone() for _ in trees]
            calls = [lambda t=t, o=o: t.k_grouped_bf16_gemm_tn_contiguous(dy, x, o, ks, c=o) for t, o in zip(trees, outs)]
            print(row(label, calls, outs, None, flops), flush=True)
    for case in issue5_cases()[0]:
        label = f"bf16 {case.label}"
        if keep(label):
            m_indices = torch.tensor(case.m_indices(), dtype=torch.int32, device="cuda")
            a = torch.randn(m_indices.numel(), case.k, device="cuda").to(torch.bfloat16)
            b = torch.randn(case.groups, case.n, case.k, device="cuda").to(torch.bfloat16)
            outs = [torch.empty(m_indices.numel(), case.n, dtype=torch.bfloat16, device="cuda") for _ in trees]
            calls = [lambda t=t, o=o: t.m_grouped_bf16_gemm_nt_contiguous(a, b, o, m_indices) for t, o in zip(trees, outs)]
            print(row(label, calls, outs, None, 2 * sum(case.counts) * case.n * case.k), flush=True)
    for case in issue5_cases()[1]:
        label = f"bf16 {case.label}"
        if keep(label):
            a = torch.randn(case.groups, case.max_m, case.k, device="cuda").to(torch.bfloat16)
            b = torch.randn(case.groups, case.n, case.k, device="cuda").to(torch.bfloat16)
            masked_m = torch.tensor(case.counts, dtype=torch.int32, device="cuda")
            valid = torch.arange(case.max_m, device="cuda")[None, :] < masked_m[:, None]
            outs = [torch.empty(case.groups, case.max_m, case.n, dtype=torch.bfloat16, device="cuda") for _ in trees]
            calls = [lambda t=t, o=o: t.m_grouped_bf16_gemm_nt_masked(a, b, o, masked_m, case.expected)
                     for t, o in zip(trees, outs)]
            print(row(label, calls, outs, valid, 2 * sum(case.counts) * case.n * case.k), flush=True)
    precompile_bf16(trees, [case for case in BF16_DENSE_CASES if keep("bf16 {} {}x{}x{}".format(*case))])
    for layout, m, n, k in BF16_DENSE_CASES:
        label = f"bf16 {layout} {m}x{n}x{k}"
        if not keep(label):
            continue
        a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda").to(torch.bfloat16)
        b = torch.randn((n, k) if layout[1] == "t" else (k, n), device="cuda").to(torch.bfloat16)
        outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in trees]
        calls = [lambda t=t, o=o, layout=layout: getattr(t, f"bf16_gemm_{layout}")(a, b, o) for t, o in zip(trees, outs)]
        print(row(label, calls, outs, None, 2 * m * n * k), flush=True)


if __name__ == "__main__":
    main()
