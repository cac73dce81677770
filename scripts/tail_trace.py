"""When does each CTA finish its tiles and tail pieces? A %globaltimer trace of the FP8 GEMM's last wave.

A patched copy of the package's headers (the repository's kernel is never changed; every patch must match
exactly once) stamps, for math thread 0 of the first math warpgroup of every CTA and each of its first 16
tiles/pieces: start (tile taken from the loader's slot), kloop (K loop done), reduce (split/stream partial
written or added), end (tile done). The stamps go to the dense GEMM's (unused) grouping pointer. Prints,
per config, the kernel time and the per-CTA timelines (µs from the first start) of a few CTAs, then when
the full waves end and the last CTA ends.

Usage: tail_trace.py MxNxK bm,bn,mode[;bm,bn,mode...]   (mode: whole, split or stream)
TAIL_EPILOGUE=1 stamps the epilogue instead: start, K loop done, each of the first two waves' stores issued
(the columns read start>kloop>wave0>wave1). Builds with overlapped stores (kOverlapStores) store inside the
K loop and leave the wave columns empty.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
UNITS = 16
STAMP = f"""
#define DG_STAMP(use, tag)                                                                              \\
    do {{                                                                                               \\
        if (threadIdx.x == 128 && (use) < {UNITS}) {{                                                    \\
            u64 dg_now;                                                                                 \\
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(dg_now));                                  \\
            reinterpret_cast<u64*>(const_cast<i32*>(problem.grouping))[(blockIdx.x * {UNITS} + (use)) * 4 + (tag)] = dg_now; \\
        }}                                                                                              \\
    }} while (0)
"""
HEADER_PATCH = ("namespace deepgemm {\n\n// Which rows", "namespace deepgemm {\n" + STAMP + "\n// Which rows")
EPILOGUE_PATCHES = [
    HEADER_PATCH,
    ("        const u32 rows = tile.rows;\n", "        DG_STAMP(use, 1);\n        const u32 rows = tile.rows;\n"),
    ("                stores.put(chunk, col0 + c * kStoreN, row0 + wave_offset);\n",
     "                stores.put(chunk, col0 + c * kStoreN, row0 + wave_offset);\n"
     "                if (w < 2) DG_STAMP(use, 2 + w);\n"),
    ("                run_tile(ring, stage, phase, stores, results, problem, me, slot.tile, slot.unit, slot.sfb, slots, use);\n",
     "                DG_STAMP(use, 0);\n"
     "                run_tile(ring, stage, phase, stores, results, problem, me, slot.tile, slot.unit, slot.sfb, slots, use);\n"),
]
PATCHES = [
    HEADER_PATCH,
    ("        const u32 rows = tile.rows;\n", "        DG_STAMP(use, 1);\n        const u32 rows = tile.rows;\n"),
    ("                    stores_tile = reduce_stream(problem, split, me.math_wg, me.thread_in_wg, me.barrier_id, results);\n",
     "                    stores_tile = reduce_stream(problem, split, me.math_wg, me.thread_in_wg, me.barrier_id, results);\n"
     "                    DG_STAMP(use, 2);\n"),
    ("                run_tile(ring, stage, phase, stores, results, problem, me, slot.tile, slot.unit, slot.sfb, slots, use);\n",
     "                DG_STAMP(use, 0);\n"
     "                run_tile(ring, stage, phase, stores, results, problem, me, slot.tile, slot.unit, slot.sfb, slots, use);\n"
     "                DG_STAMP(use, 3);\n"),
]


def make_include(root: Path) -> Path:
    from ablate import patch_include

    patches = EPILOGUE_PATCHES if os.environ.get("TAIL_EPILOGUE") == "1" else PATCHES
    return patch_include(root / "include", patches, "tail trace")


def main() -> None:
    import torch

    from deepgemm.bench.timing import bench_gpu
    from deepgemm.configs.heuristics import make_config
    from deepgemm.kernels.device import sm_count
    from deepgemm.kernels.fp8_gemm import get_plan
    from tests.helpers import random_operands

    m, n, k = (int(v) for v in sys.argv[1].split("x"))
    sms = sm_count(0)
    a, b = random_operands(m, n, k, "cuda", seed=1)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    for tile in sys.argv[2].split(";"):
        bm, bn, mode = tile.split(",")
        config = make_config(m, n, k, int(bm), int(bn), sms, 2, cluster_m=1, split_tail=mode == "split",
                             stream_tail=mode == "stream")
        plan = get_plan(0, m, n, k, torch.bfloat16, config)
        buffer = torch.zeros(plan.grid * UNITS * 4, dtype=torch.int64, device="cuda")
        t = bench_gpu(lambda: plan.launch(a[0], a[1], b[0], b[1], out, buffer.view(torch.int32)), iters=10, warmup=2)
        torch.cuda.synchronize()
        stamps = buffer.view(plan.grid, UNITS, 4).cpu().tolist()
        base = min(s[0] for cta in stamps for s in cta if s[0])
        ends = []
        print(f"### {m}x{n}x{k} {config.label()}: {t.median_us:.1f} µs, splits {plan.split_count()}")
        for cta, units in enumerate(stamps):
            used = [u for u in units if u[0]]
            ends.append(max(u[3] for u in used) - base if used else 0)
            if cta in (0, 1, plan.grid // 2, plan.grid - 17, plan.grid - 16, plan.grid - 9, plan.grid - 1):
                line = " | ".join(
                    f"{(u[0] - base) / 1e3:.1f}>{(u[1] - base) / 1e3:.1f}" + (f">r{(u[2] - base) / 1e3:.1f}" if u[2] else "")
                    + f">{(u[3] - base) / 1e3:.1f}" for u in used)
                print(f"  cta {cta:3d}: {line}")
        print(f"  last end {max(ends) / 1e3:.1f} µs; CTA ends: min {min(ends) / 1e3:.1f}, median {sorted(ends)[len(ends) // 2] / 1e3:.1f}")


if __name__ == "__main__":
    if os.environ.get("DEEPGEMM_INCLUDE_DIR"):
        main()
    else:
        include = make_include(Path(tempfile.mkdtemp(prefix="deepgemm-tail-")))
        env = dict(os.environ, DEEPGEMM_INCLUDE_DIR=str(include))
        raise SystemExit(subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode)
