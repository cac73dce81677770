"""Where does a math warpgroup's time go between K blocks? A clock64 trace of the FP8 GEMM consumer.

A patched copy of the package's headers (the repository's kernel is never changed; every patch must match
exactly once) records, for math thread 0 of each warpgroup in the first TRACE_CTAS CTAs, a clock64 stamp at:
  full    the stage's full barrier passed (operands are in shared memory)
  issued  the K block's four wgmmas are issued (and committed)
  retired wgmma_wait_group<0> returned (the block's MMAs are done)
  promoted the block's promotion FFMAs are done
The stamps go to the buffer passed as the dense GEMM's (unused) grouping pointer; the last launch's are summarized per warpgroup over the steady part of
the first tile: mean cycles from one event to the next, the K-block period, and how often the tensor cores
could have been idle (no warpgroup had MMAs in flight).

Usage: trace_consumer.py [MxNxK] (default 4096x7168x16384)
TRACE_MARKS=full,issued,... limits the stamps (each stamp is a clock read ptxas will not move code across:
the "issued" stamp stops ptxas from interleaving promotion FFMAs between the next block's wgmmas).
TRACE_CONFIG=bm,bn,cluster_m[,stages][;...] (default: the cost model's pick); TRACE_VARIANT names a patch set
from scripts/ablate.py applied on top (e.g. no_loads).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

CTAS = int(os.environ.get("TRACE_CTAS", "4"))
TAG_NAMES = ["full", "issued", "retired", "promoted"]
MARK_MASK = sum(1 << TAG_NAMES.index(name) for name in os.environ.get("TRACE_MARKS", ",".join(TAG_NAMES)).split(",") if name)
EVENTS = 1024
TAGS = dict(enumerate(TAG_NAMES))

# The stamps' buffer (the dense GEMM's unused grouping pointer) and per-warpgroup event counters live in
# static shared memory, so a mark works anywhere in the consumer (K-loop helpers and lambdas included).
MARK = f"""
__shared__ u64* dg_trace_buf;
__shared__ u32 dg_trace_count[4];
#define DG_MARK(tag)                                                                                     \\
    do {{                                                                                                \\
        if ((({MARK_MASK}u >> (tag)) & 1u) != 0 && blockIdx.x < {CTAS} && threadIdx.x % 128 == 0) {{      \\
            const u32 dg_wg = threadIdx.x / 128 - 1;                                                     \\
            const u32 dg_ti = dg_trace_count[dg_wg]++;                                                   \\
            if (dg_ti < {EVENTS}) {{                                                                      \\
                dg_trace_buf[(blockIdx.x * 4 + dg_wg) * {EVENTS} + dg_ti] = (clock64() & ((1ull << 60) - 1)) | (u64(tag) << 60); \\
            }}                                                                                           \\
        }}                                                                                               \\
    }} while (0)
"""

PATCHES: list[tuple[str, str]] = [
    ("namespace deepgemm {\n\n// Which rows", "namespace deepgemm {\n" + MARK + "\n// Which rows"),
    ("        if (threadIdx.x == 0) {\n            ptx::tma_prefetch_descriptor(tma_a);\n",
     "        if (threadIdx.x < 4) {\n            dg_trace_count[threadIdx.x] = 0;\n        }\n"
     "        if (threadIdx.x == 0) {\n            dg_trace_buf = reinterpret_cast<u64*>(const_cast<i32*>(problem.grouping));\n"
     "            ptx::tma_prefetch_descriptor(tma_a);\n"),
    # unpipelined
    ("                ptx::mbarrier_wait(&ring.full[stage], phase);\n#pragma unroll\n                for (u32 w = 0; w < kNumWaves; ++w) {\n",
     "                ptx::mbarrier_wait(&ring.full[stage], phase);\n                DG_MARK(0);\n#pragma unroll\n"
     "                for (u32 w = 0; w < kNumWaves; ++w) {\n"),
    ("                    issue_block<kTileN>(ring, stage, wave_row(w, t.math_wg), t.row_in_wg, partial, scale_a);\n",
     "                    issue_block<kTileN>(ring, stage, wave_row(w, t.math_wg), t.row_in_wg, partial, scale_a);\n"
     "                    DG_MARK(1);\n"),
    ("                    ptx::wgmma_wait_group<0>();\n                    ptx::fence_accumulators(partial);\n",
     "                    ptx::wgmma_wait_group<0>();\n                    ptx::fence_accumulators(partial);\n"
     "                    DG_MARK(2);\n"),
    ("                        promotion.template apply<kStraddleCol, kTileN, false>(results[w], partial, scales);\n                    }\n",
     "                        promotion.template apply<kStraddleCol, kTileN, false>(results[w], partial, scales);\n                    }\n"
     "                    DG_MARK(3);\n"),
    # pipelined
    ("                ptx::mbarrier_wait(&ring.full[issue_stage], issue_phase);\n",
     "                ptx::mbarrier_wait(&ring.full[issue_stage], issue_phase);\n                DG_MARK(0);\n"),
    ("                issue_block<kTileN>(ring, issue_stage, t.first_row, t.row_in_wg, partial, scale_a);\n",
     "                issue_block<kTileN>(ring, issue_stage, t.first_row, t.row_in_wg, partial, scale_a);\n                DG_MARK(1);\n"),
    ("                ptx::wgmma_wait_group<0>();\n                ptx::fence_accumulators(partial);\n"
     "                release_stage(ring, stage, t.lane);\n",
     "                ptx::wgmma_wait_group<0>();\n                ptx::fence_accumulators(partial);\n"
     "                DG_MARK(2);\n                release_stage(ring, stage, t.lane);\n"),
    ("                promotion.template apply<kStraddleCol, kTileN>(result, partial0, scales0);\n                retire(partial1);\n"
     "                issue(partial0, scales0);\n                promotion.template apply<kStraddleCol, kTileN>(result, partial1, scales1);\n",
     "                promotion.template apply<kStraddleCol, kTileN>(result, partial0, scales0);\n                DG_MARK(3);\n"
     "                retire(partial1);\n                issue(partial0, scales0);\n"
     "                promotion.template apply<kStraddleCol, kTileN>(result, partial1, scales1);\n                DG_MARK(3);\n"),
]


def make_include(root: Path, variant: str) -> Path:
    from ablate import VARIANTS, patch_include

    return patch_include(root / "include", VARIANTS.get(variant, []) + PATCHES, "consumer trace")


def summarize(events: list[tuple[int, int]], label: str) -> None:
    """events: (tag, clock) in program order for one warpgroup."""
    if len(events) < 40:
        print(f"{label}: only {len(events)} events")
        return
    steady = events[len(events) // 8: len(events) * 7 // 8]
    gaps: dict[tuple[str, str], list[int]] = {}
    for (tag0, t0), (tag1, t1) in zip(steady, steady[1:]):
        gaps.setdefault((TAGS[tag0], TAGS[tag1]), []).append(t1 - t0)
    issued = [t for tag, t in steady if tag == 1]
    period = (issued[-1] - issued[0]) / max(1, len(issued) - 1)
    parts = ", ".join(f"{a}->{b} {statistics.mean(v):.0f} (n={len(v)})" for (a, b), v in sorted(gaps.items()))
    print(f"{label}: {period:.0f} cycles per issued block; {parts}")


def main() -> None:
    import torch

    from deepgemm.bench.timing import bench_gpu
    from deepgemm.configs.heuristics import choose_fp8_gemm_config, make_config
    from deepgemm.kernels.device import sm_count
    from deepgemm.kernels.fp8_gemm import get_plan
    from tests.helpers import random_operands

    shape = sys.argv[1] if len(sys.argv) > 1 else "4096x7168x16384"
    m, n, k = (int(v) for v in shape.split("x"))
    torch.zeros(1, device="cuda")
    sms = sm_count(0)
    a, b = random_operands(m, n, k, "cuda", seed=1)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    for tile in [t for t in os.environ.get("TRACE_CONFIG", "").split(";") if t] or [""]:
        if tile:
            bm, bn, cm, *stages = (int(v) for v in tile.split(","))
            config = make_config(m, n, k, bm, bn, sms, 2, cluster_m=cm, num_stages=stages[0] if stages else None)
        else:
            config = choose_fp8_gemm_config(m, n, k, sms)
        plan = get_plan(0, m, n, k, torch.bfloat16, config)
        buffer = torch.zeros(CTAS * 4 * EVENTS, dtype=torch.int64, device="cuda")
        # Dense GEMMs ignore the grouping pointer: the patched kernel writes its stamps there.
        grouping = buffer.view(torch.int32)
        t = bench_gpu(lambda: plan.launch(a[0], a[1], b[0], b[1], out, grouping), iters=10, warmup=2)
        torch.cuda.synchronize()
        host = buffer.cpu()
        trace = host.view(CTAS, 4, EVENTS).tolist()
        print(f"### {shape} {config.label()} marks={os.environ.get('TRACE_MARKS', 'all')!r}: {t.median_us:.1f} µs "
              f"({2 * m * n * k / t.median_us / 1e6:.0f} TFLOPS)")
        if not MARK_MASK:
            continue
        for cta in range(CTAS):
            for wg in range(4):
                raw = [v for v in trace[cta][wg] if v]
                if raw:
                    summarize([(v >> 60, v & ((1 << 60) - 1)) for v in raw], f"cta {cta} wg {wg}")
        timelines = [[(v >> 60, v & ((1 << 60) - 1)) for v in trace[0][wg][:48] if v] for wg in range(4)]
        timelines = [t for t in timelines if t]
        base = min(t for line in timelines for _, t in line) if timelines else 0
        print("cta 0 timeline (first 48 events per warpgroup, cycles from the first):")
        for wg, line in enumerate(timelines):
            print(f"  wg{wg}: " + " ".join(f"{TAGS[tag][0]}{t - base}" for tag, t in line))


if __name__ == "__main__":
    if os.environ.get("DEEPGEMM_INCLUDE_DIR"):
        main()
    else:
        root = Path(tempfile.mkdtemp(prefix="deepgemm-trace-"))
        include = make_include(root, os.environ.get("TRACE_VARIANT", ""))
        env = dict(os.environ, DEEPGEMM_INCLUDE_DIR=str(include))
        raise SystemExit(subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode)
