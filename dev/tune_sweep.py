"""Time candidate FP8 GEMM configs per shape on the GPU (calibrates the cost model; one device call).

For each shape: the cost model's top candidates plus each with the cluster choice flipped, plus
fixed alternatives. Prints one line per shape: the model's pick and the measured best, and writes all
timings as JSON to $OUT/tune.json.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.helpers, dev.*

import torch  # noqa: E402

from deepgemm.tuning.timing import bench_gpu  # noqa: E402
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import (candidate_tiles, choose_fp8_gemm_config,  # noqa: E402
                                                            clusters_allowed, make_config, ranked_candidates)
from deepgemm.kernels.sm90_fp8_gemm_1d2d.smem import max_stages  # noqa: E402
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan  # noqa: E402
from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec  # noqa: E402
from deepgemm.kernels.common.device import sm_count  # noqa: E402
from tests.helpers import random_operands  # noqa: E402

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
SHAPES = [(m, n, k) for m in (64, 128, 4096) for n, k in NK]


def candidates(m: int, n: int, k: int, sms: int) -> list:
    ranked = ranked_candidates(m, n, k, sms, allow_block_m_192=True)
    picks = {(bm, bn) for _, bm, bn in ranked[:6]}
    for bm, bn in ((64, 64), (64, 128), (128, 128), (128, 112), (128, 144), (128, 160), (128, 192), (64, 192), (64, 32)):
        if (bm, bn) in candidate_tiles(m, n) and max_stages(bm, bn, k, 2) >= 2:
            picks.add((bm, bn))
    configs = set()
    for bm, bn in picks:
        for cm in (1, 2):
            if cm == 2 and not clusters_allowed(m, bm, bn, sms):
                continue
            configs.add(make_config(m, n, k, bm, bn, sms, 2, cluster_m=cm))
    return sorted(configs, key=lambda c: (c.block_m, c.block_n, c.cluster_m))


def main() -> None:
    sms = sm_count(0)
    jobs = {shape: candidates(*shape, sms) for shape in SHAPES}
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda item: compile_spec(Fp8GemmSpec(item[0][1], item[0][2], torch.bfloat16, item[1])),
                      [(shape, c) for shape, cs in jobs.items() for c in cs]))
    results = []
    for (m, n, k), configs in jobs.items():
        a, b = random_operands(m, n, k, "cuda", seed=1)
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        timed = []
        for config in configs:
            plan = get_plan(0, m, n, k, torch.bfloat16, config=config)
            sfa = a[1]
            t = bench_gpu(lambda: plan.launch(a[0], sfa, b[0], b[1], out), iters=20, warmup=3)
            timed.append((t.median_us, config.label()))
        timed.sort()
        model = choose_fp8_gemm_config(m, n, k, sms).label()
        model_us = next((us for us, label in timed if label == model), float("nan"))
        results.append({"shape": [m, n, k], "timed": timed, "model": model})
        print(f"{m}x{n}x{k}: model {model} {model_us:.1f}us | best {timed[0][1]} {timed[0][0]:.1f}us | "
              f"2nd {timed[1][1] if len(timed) > 1 else '-'} {timed[1][0] if len(timed) > 1 else 0:.1f}us", flush=True)
    path = os.path.join(os.environ.get("OUT", "."), "tune.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
