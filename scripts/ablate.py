"""Where does the FP8 GEMM's time go? Time the kernel with one part removed at a time (one device call).

Each variant is a patched copy of the package's headers (the repository's kernel is never changed);
every patch must match exactly once, so a stale script fails loudly instead of timing the wrong thing.
Variants:
  base        the kernel as shipped
  no_promote  promotion skipped (wgmma results unused; the MMAs still run)
  no_mma      wgmma instructions removed (loads, barriers, promotion, epilogue remain)
  no_loads    A/B TMA loads removed (MMAs read stale shared memory: no L2/HBM traffic for operands)
  no_store    epilogue store skipped (results are still reduced, so promotion stays)
Usage: ablate.py [MxNxK ...]   (default: three M = 4096 shapes). Prints a table of median µs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

KERNEL = "deepgemm/kernels/sm90_fp8_gemm_1d2d.cuh"
VARIANTS: dict[str, list[tuple[str, str]]] = {
    "base": [],
    "no_promote": [(
        "            const float scale_b0 = sfb_tile[k_block];\n",
        "            if (scale_a.lo != 12345.0f) return;\n            const float scale_b0 = sfb_tile[k_block];\n",
    )],
    "no_mma": [("            Mma::mma(desc_a + 2 * k, desc_b + 2 * k, partial, k > 0);\n", "")],
    "no_loads": [
        ("                ptx::tma_load_2d(ring.smem + kOffsetA + stage * kStageABytes, tma_a, full, k, row_a);\n", ""),
        ("                    ptx::tma_load_2d(ring.smem + kOffsetB + stage * kStageBBytes, tma_b, full, k, row_b);\n", ""),
        ("ptx::mbarrier_arrive_expect_tx(full, kStageTxBytes);", "ptx::mbarrier_arrive_expect_tx(full, kStageSfaBytes);"),
    ],
    "no_store": [(
        "            Store::store(result, d_tile, tma_d, col0, row0, thread_in_wg, barrier_id);\n        }\n        Store::drain",
        "            float sink = 0.0f;\n#pragma unroll\n            for (u32 i = 0; i < kBlockN / 2; ++i) sink += result[i];\n"
        "            if (sink == 12345.0f) Store::store(result, d_tile, tma_d, col0, row0, thread_in_wg, barrier_id);\n"
        "        }\n        Store::drain",
    )],
}
SHAPES = ["4096x7168x16384", "4096x4096x7168", "4096x2112x7168"]


def make_include(root: Path, name: str) -> Path:
    import deepgemm

    src = Path(deepgemm.__file__).resolve().parent / "include"
    dst = root / name
    shutil.copytree(src, dst)
    path = dst / KERNEL
    text = path.read_text()
    for old, new in VARIANTS[name]:
        if text.count(old) != 1:
            raise SystemExit(f"variant {name}: patch target found {text.count(old)} times: {old[:60]!r}")
        text = text.replace(old, new)
    path.write_text(text)
    return dst


def compile_one(shape: str) -> None:
    import torch

    from deepgemm.configs.heuristics import choose_fp8_gemm_config
    from deepgemm.kernels.device import sm_count
    from deepgemm.kernels.fp8_gemm import Fp8GemmSpec, compile_spec

    m, n, k = (int(v) for v in shape.split("x"))
    compile_spec(Fp8GemmSpec(n, k, torch.bfloat16, choose_fp8_gemm_config(m, n, k, sm_count(0))))


def time_one(shape: str) -> None:
    import torch

    from deepgemm.bench.timing import bench_gpu
    from deepgemm.configs.heuristics import choose_fp8_gemm_config
    from deepgemm.kernels.device import sm_count
    from deepgemm.kernels.fp8_gemm import get_plan
    from tests.helpers import random_operands

    m, n, k = (int(v) for v in shape.split("x"))
    config = choose_fp8_gemm_config(m, n, k, sm_count(0))
    plan = get_plan(0, m, n, k, torch.bfloat16, config)
    a, b = random_operands(m, n, k, "cuda", seed=1)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    t = bench_gpu(lambda: plan.launch(a[0], a[1], b[0], b[1], out), iters=30, warmup=3)
    print(f"{t.median_us:.1f} {config.label()}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] in ("--time", "--compile"):
        (time_one if sys.argv[1] == "--time" else compile_one)(sys.argv[2])
        return
    shapes = sys.argv[1:] or SHAPES
    root = Path(tempfile.mkdtemp(prefix="deepgemm-ablate-"))
    includes = {name: make_include(root, name) for name in VARIANTS}
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:  # compile every variant up front, in parallel
        list(pool.map(lambda job: subprocess.run([sys.executable, __file__, "--compile", job[1]], capture_output=True,
                                                 env=dict(os.environ, DEEPGEMM_INCLUDE_DIR=str(includes[job[0]]))),
                      [(name, shape) for name in VARIANTS for shape in shapes]))
    rows = []
    for shape in shapes:
        m, n, k = (int(v) for v in shape.split("x"))
        row = [shape]
        for name in VARIANTS:
            env = dict(os.environ, DEEPGEMM_INCLUDE_DIR=str(includes[name]))
            try:
                done = subprocess.run([sys.executable, __file__, "--time", shape], env=env, capture_output=True,
                                      text=True, timeout=120)
                last = (done.stdout.strip().splitlines() or ["?"])[-1]
                row.append(last.split()[0] if done.returncode == 0 else f"rc{done.returncode}")
                if done.returncode:
                    print(done.stderr[-2000:], file=sys.stderr)
            except subprocess.TimeoutExpired:
                row.append("hang")
            flops = 2 * m * n * k
            try:
                row[-1] += f" ({flops / float(row[-1]) / 1e6:.0f})"
            except ValueError:
                pass
        rows.append(row)
        print(" | ".join(row), flush=True)
    print("| shape | " + " | ".join(f"{v} µs (TFLOPS)" for v in VARIANTS) + " |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
