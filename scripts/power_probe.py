"""Is a GEMM limited by the clock the GPU can hold under its power cap? (one device call)

Runs each implementation back to back for a fixed wall time (steady state, no L2 flush) while
nvidia-smi samples the SM clock, board power and throttle reasons, then prints per implementation:
µs per call, TFLOPS, median SM MHz and W, and TFLOPS per GHz (work done per clock, independent of
the clock the power limit allows). Two kernels with equal TFLOPS/GHz differ only by clock, i.e. by
energy per GEMM; a higher TFLOPS/GHz at a lower clock points at power, not at the schedule.

Usage: power_probe.py [MxNxK ...]   (default 4096x7168x16384)
PROBE_CONFIGS=bm,bn,cluster_m[,stages][;...] adds deepgemm with those tiles next to the model's pick.
PROBE_SECONDS (default 2.0) sets the run time per implementation.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"


def sample_while(fn: Callable[[], Any], seconds: float) -> tuple[float, float, float, str]:
    """Call `fn` back to back for `seconds`; return (µs per call, median MHz, median W, throttle masks seen)."""
    import torch

    sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(0.3)  # nvidia-smi's first samples come late (the GPU is idle meanwhile; see the trimming below)
    torch.cuda.synchronize()
    calls = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    sampler.terminate()
    lines = (sampler.communicate(timeout=5)[0] or "").strip().splitlines()
    rows = [[v.strip() for v in line.split(",")] for line in lines if line.count(",") == 2]
    busy = rows[len(rows) // 4: max(len(rows) * 3 // 4, len(rows) // 4 + 1)]  # the steady middle half
    mhz = statistics.median(float(r[0]) for r in busy) if busy else float("nan")
    watts = statistics.median(float(r[1]) for r in busy) if busy else float("nan")
    reasons = ",".join(sorted({r[2] for r in busy}))
    return elapsed / calls * 1e6, mhz, watts, reasons


def launcher(plan: Any, a: Any, sfa: Any, b: Any, sfb: Any, out: Any) -> Callable[[], Any]:
    return lambda: plan.launch(a, sfa, b, sfb, out)


def implementations(m: int, n: int, k: int) -> list[tuple[str, Callable[[], Any]]]:
    import torch

    from deepgemm.bench.inputs import make_problem
    from deepgemm.bench.peers import CUBLAS_BLOCKWISE, CUBLAS_TENSORWISE, DEEPGEMM_FP8, Unavailable
    from deepgemm.configs.heuristics import make_config
    from deepgemm.kernels.device import sm_count
    from deepgemm.kernels.fp8_gemm import get_plan

    problem = make_problem((m, n, k), "fp8", device="cuda", seed=1)
    found: list[tuple[str, Callable[[], Any]]] = []
    for impl in (DEEPGEMM_FP8, CUBLAS_BLOCKWISE, CUBLAS_TENSORWISE):
        try:
            found.append((impl.name, impl.prepare(problem).fn))
        except Unavailable as exc:
            print(f"{impl.name}: n/a ({exc})")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    for tile in (t for t in os.environ.get("PROBE_CONFIGS", "").split(";") if t):
        bm, bn, cm, *stages = (int(v) for v in tile.split(","))
        config = make_config(m, n, k, bm, bn, sm_count(0), 2, cluster_m=cm, num_stages=stages[0] if stages else None)
        plan = get_plan(0, m, n, k, torch.bfloat16, config)
        a, sfa, b, sfb = problem.a_fp8, problem.sfa, problem.b_fp8, problem.sfb
        found.append((f"deepgemm {config.label()}", launcher(plan, a, sfa, b, sfb, out)))
    return found


def main() -> None:
    import torch

    seconds = float(os.environ.get("PROBE_SECONDS", "2.0"))
    torch.zeros(1, device="cuda")
    print("| shape | implementation | µs/call | TFLOPS | SM MHz | W | TFLOPS/GHz | clock event reasons |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in sys.argv[1:] or ["4096x7168x16384"]:
        m, n, k = (int(v) for v in shape.split("x"))
        for name, fn in implementations(m, n, k):
            for _ in range(3):
                fn()
            us, mhz, watts, reasons = sample_while(fn, seconds)
            tflops = 2 * m * n * k / us / 1e6
            print(f"| {shape} | {name} | {us:.1f} | {tflops:.0f} | {mhz:.0f} | {watts:.0f} | {tflops / (mhz / 1e3):.0f} | {reasons} |",
                  flush=True)
            time.sleep(1.0)  # let the clock recover between implementations


if __name__ == "__main__":
    main()
