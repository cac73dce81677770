"""Where does the FP8 GEMM's time go? Time the kernel with one part removed at a time (one device call).

Each variant is a patched copy of the package's headers (the repository's kernel is never changed);
every patch must match exactly once, so a stale script fails loudly instead of timing the wrong thing.
Variants:
  base        the kernel as shipped
  no_promote  promotion skipped (wgmma results unused; the MMAs still run)
  no_mma      wgmma instructions removed (loads, barriers, promotion, epilogue remain)
  no_loads    A/B TMA loads removed (MMAs read stale shared memory: no L2/HBM traffic for operands)
  no_a_loads  only A's loads removed (dense kinds: whole-tile A boxes); no_b_loads: only B's
  no_store    epilogue store skipped (results are still reduced, so promotion stays)
  mma_only    no_promote and no_loads together
  no_tma      no TMA loads at all (sfa too): the producer only arrives on each stage
  handshake   no_tma and no_mma together: the stage ring, promotion and epilogue
Usage: ablate.py [MxNxK ...]   (default: three M = 4096 shapes). Prints a table of median µs.
ABLATE_CONFIG=bm,bn,cluster_m[,stages[,chunked_store[,split_tail]]][;...] times those tiles (deepest pipeline unless
stages > 0 is given; chunked_store 1: block_m 256 stores through one chunk buffer per warpgroup; split_tail 1: the
split-tail build, split-K at decode sizes; an empty
entry: the cost model's pick) instead of the cost model's pick (one row per shape and tile);
ABLATE_VARIANTS=base,no_mma,... limits the variants (ABLATE_VARIANTS=base ABLATE_CONFIG=";128,192,1" compares
the model's pick with other tiles). ABLATE_POWER=1 also runs
each variant back to back for 1.5 s and reports its SM clock, power and TFLOPS per GHz (scripts/power_probe.py):
under the power cap a removed part can look faster only because the clock rose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the package and tests.helpers, run from anywhere
KERNEL = "deepgemm/kernels/sm90_fp8_gemm_1d2d.cuh"
VARIANTS: dict[str, list[tuple[str, str]]] = {
    "base": [],
    "no_promote": [(
        "const BlockScales& s) const {\n",
        "const BlockScales& s) const {\n            if (s.lo0 != 12345.0f) return;\n",
    )],
    "no_mma": [("        ptx::mma_k128_block<ptx::WgmmaFp8<kTileN>>(desc_a, desc_b, partial);\n", "")],
    "no_loads": [
        ("                    ptx::tma_load_2d(ring.smem + kOffsetA + stage * kStageABytes, desc_a, full, k, row_a);\n", ""),
        ("                    ptx::tma_load_2d(ring.smem + kOffsetB + stage * kStageBBytes, desc_b, full, k, row_b);\n", ""),
        ("ptx::mbarrier_arrive_expect_tx(full, tx_bytes);", "ptx::mbarrier_arrive_expect_tx(full, kStageSfaBytes);"),
    ],
    "no_store": [(
        "            store.store(values, tma_d, to_col, to_row, threadIdx.x % 128, threadIdx.x / 128);\n",
        "            float sink = 0.0f;\n#pragma unroll\n            for (u32 i = 0; i < kStoreN / 2; ++i) sink += values[i];\n"
        "            if (sink == 12345.0f) store.store(values, tma_d, to_col, to_row, threadIdx.x % 128, threadIdx.x / 128);\n",
    ), (
        "                store.store_bf16(packed, tma_d, tile.n_block * kBlockN,\n",
        "                u32 sink = 0;\n#pragma unroll\n                for (u32 i = 0; i < kBlockN / 4; ++i) sink ^= packed[i];\n"
        "                if (sink == 12345u) store.store_bf16(packed, tma_d, tile.n_block * kBlockN,\n",
    )],
}
# One operand's loads removed (its bytes leave the stage's transaction count): which operand's traffic limits?
VARIANTS["no_a_loads"] = [
    VARIANTS["no_loads"][0],
    ("ptx::mbarrier_arrive_expect_tx(full, tx_bytes);", "ptx::mbarrier_arrive_expect_tx(full, tx_bytes - kStageABytes);"),
]
VARIANTS["no_b_loads"] = [
    VARIANTS["no_loads"][1],
    ("ptx::mbarrier_arrive_expect_tx(full, tx_bytes);", "ptx::mbarrier_arrive_expect_tx(full, tx_bytes - kStageBBytes);"),
]
VARIANTS["mma_only"] = VARIANTS["no_promote"] + VARIANTS["no_loads"]  # the MMAs, barriers and epilogue alone
# No TMA at all (sfa too: the producer only arrives on each stage): what the stage ring costs by itself.
VARIANTS["no_tma"] = VARIANTS["no_loads"][:2] + [
    ("ptx::tma_load_2d(ring.smem + kOffsetSfa + stage * kStageSfaBytes, desc_sfa, full, sfa_col,",
     "if (k_block == ~0u) ptx::tma_load_2d(ring.smem + kOffsetSfa + stage * kStageSfaBytes, desc_sfa, full, sfa_col,"),
    ("ptx::mbarrier_arrive_expect_tx(full, tx_bytes);", "ptx::mbarrier_arrive_expect_tx(full, 0u);"),
]
VARIANTS["handshake"] = VARIANTS["no_tma"] + VARIANTS["no_mma"]  # ring handshakes, promotion and epilogue only
SHAPES = ["4096x7168x16384", "4096x4096x7168", "4096x2112x7168"]


def patch_include(dst: Path, patches: list[tuple[str, str]], label: str) -> Path:
    """A copy of the package's headers at `dst` with the kernel header patched by exact text: every patch
    target must occur exactly once (shared by the ablation, consumer-trace and tail-trace scripts)."""
    import deepgemm

    shutil.copytree(Path(deepgemm.__file__).resolve().parent / "include", dst)
    path = dst / KERNEL
    text = path.read_text()
    for old, new in patches:
        if text.count(old) != 1:
            raise SystemExit(f"{label}: patch target found {text.count(old)} times: {old[:70]!r}")
        text = text.replace(old, new)
    path.write_text(text)
    return dst


def make_include(root: Path, name: str) -> Path:
    return patch_include(root / name, VARIANTS[name], f"variant {name}")


def chosen_config(m: int, n: int, k: int):  # noqa: ANN201 - GemmConfig, imported lazily
    from deepgemm.configs.heuristics import choose_fp8_gemm_config, make_config
    from deepgemm.kernels.device import sm_count

    override = os.environ.get("ABLATE_CONFIG")
    if not override:
        return choose_fp8_gemm_config(m, n, k, sm_count(0))
    bm, bn, cm, *rest = (int(v) for v in override.split(","))
    stages = rest[0] if rest and rest[0] > 0 else None
    chunked_store = bool(rest[1]) if len(rest) > 1 and bm == 256 else None
    split_tail = len(rest) > 2 and bool(rest[2])
    return make_config(m, n, k, bm, bn, sm_count(0), 2, cluster_m=cm, num_stages=stages, chunked_store=chunked_store,
                       split_tail=split_tail)


def chosen_block_m(m: int, n: int, k: int) -> int:
    """block_m of the cost model's pick for an H200 (132 SMs), without a GPU."""
    from deepgemm.configs.heuristics import choose_fp8_gemm_config

    return choose_fp8_gemm_config(m, n, k, 132).block_m


def compile_one(shape: str) -> None:
    """Build one cell's kernel ahead (no GPU needed: the grid is taken as the H200's 132 SMs)."""
    from unittest import mock

    import torch

    from deepgemm.kernels.fp8_gemm import Fp8GemmSpec, compile_spec

    m, n, k = (int(v) for v in shape.split("x"))
    with mock.patch("deepgemm.kernels.device.sm_count", lambda _: 132):
        config = chosen_config(m, n, k)
    result = compile_spec(Fp8GemmSpec(n, k, torch.bfloat16, config))
    print(f"{shape} {config.label()}: {result.resources}")


def time_one(shape: str) -> None:
    import torch

    from deepgemm.bench.timing import bench_gpu
    from deepgemm.kernels.fp8_gemm import get_plan
    from tests.helpers import random_operands

    m, n, k = (int(v) for v in shape.split("x"))
    config = chosen_config(m, n, k)
    plan = get_plan(0, m, n, k, torch.bfloat16, config)
    a, b = random_operands(m, n, k, "cuda", seed=1)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    t = bench_gpu(lambda: plan.launch(a[0], a[1], b[0], b[1], out), iters=30, warmup=3)
    if os.environ.get("ABLATE_POWER") == "1":
        from power_probe import sample_while

        steady_us, mhz, watts, _ = sample_while(lambda: plan.launch(a[0], a[1], b[0], b[1], out), 1.5)
        print(f"power: {steady_us:.1f} {mhz:.0f} {watts:.0f}")
    check = ""
    if os.environ.get("ABLATE_CHECK") == "1":  # the timed kernel's result against float64 (A/B of new headers)
        from deepgemm import calc_diff
        from tests.helpers import reference_fp64

        out.fill_(float("nan"))
        plan.launch(a[0], a[1], b[0], b[1], out)
        check = f" diff{calc_diff(out.double(), reference_fp64(a, b)):.1e}"
    print(f"{t.median_us:.1f} {config.label()} grid{plan.grid}{check}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] in ("--time", "--compile"):
        (time_one if sys.argv[1] == "--time" else compile_one)(sys.argv[2])
        return
    shapes = sys.argv[1:] or SHAPES
    tiles = os.environ.get("ABLATE_CONFIG", "").split(";")  # an empty entry is the cost model's pick
    names = [v for v in os.environ.get("ABLATE_VARIANTS", ",".join(VARIANTS)).split(",") if v]
    root = Path(tempfile.mkdtemp(prefix="deepgemm-ablate-"))
    includes = {name: make_include(root, name) for name in names}

    def env_for(name: str, tile: str) -> dict[str, str]:
        env = dict(os.environ, DEEPGEMM_INCLUDE_DIR=str(includes[name]), ABLATE_CONFIG=tile)
        return env

    def runs(name: str, shape: str, tile: str) -> bool:
        # Without operand loads a multicast cluster never completes its transaction counts: skip. The variants
        # without A loads expect a whole block's A and sfa bytes, which a partial last M-block (its own smaller
        # boxes) never delivers: skip those shapes too rather than hang.
        if name in ("no_loads", "mma_only") and tile.split(",")[2:3] == ["2"]:
            return False
        without_a = name in ("no_loads", "mma_only", "no_a_loads")
        m, n, k = (int(v) for v in shape.split("x"))
        block_m = int(tile.split(",")[0]) if tile else chosen_block_m(m, n, k)
        return not (without_a and m % block_m != 0)

    jobs = [(name, shape, tile) for name in names for shape in shapes for tile in tiles if runs(name, shape, tile)]
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:  # compile every variant up front, in parallel
        list(pool.map(lambda job: subprocess.run([sys.executable, __file__, "--compile", job[1]], capture_output=True,
                                                 env=env_for(job[0], job[2])), jobs))
    rows = []
    for shape in shapes:
        for tile in tiles:
            m, n, k = (int(v) for v in shape.split("x"))
            row = [shape, tile or "model"]
            for name in names:
                if not runs(name, shape, tile):
                    row.append("n/a")
                    continue
                try:
                    done = subprocess.run([sys.executable, __file__, "--time", shape], env=env_for(name, tile),
                                          capture_output=True, text=True, timeout=60)
                    lines = done.stdout.strip().splitlines() or ["?"]
                    last = lines[-1]
                    power = [line.split()[1:] for line in lines if line.startswith("power: ")]
                    if done.returncode:
                        row.append(f"rc{done.returncode}")
                        print(done.stderr[-2000:], file=sys.stderr)
                    else:
                        us = float(last.split()[0])
                        cell = f"{us:.1f} ({2 * m * n * k / us / 1e6:.0f})"
                        if power:  # steady state, back to back: µs, SM MHz, W and TFLOPS per GHz
                            steady_us, mhz, watts = (float(v) for v in power[0])
                            per_ghz = 2 * m * n * k / steady_us / 1e6 / (mhz / 1e3)
                            cell += f" steady {steady_us:.0f} µs @{mhz:.0f} MHz {watts:.0f} W = {per_ghz:.0f}/GHz"
                        row.append(cell)
                        if not tile:
                            row[1] = " ".join(last.split()[1:4])
                except subprocess.TimeoutExpired:
                    row.append("hang")
            rows.append(row)
            print(" | ".join(row), flush=True)
    print("| shape | tile | " + " | ".join(f"{v} µs (TFLOPS)" for v in names) + " |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
