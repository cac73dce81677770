"""Dense FP8 GEMM builds against the cost model's pick, DeepGEMM HEAD interleaved where it imports.

  python dev/dense_tile_ab.py [MxNxK ...] [--tiles 64x192,128x128u,64x16us16,...] [--clusters] [--compile-only]

`--flush read` flushes L2 by reading (clean lines) instead of zeroing.
Builds per shape: the model's pick; each `--tiles` tile (BMxBN, suffix `u` / `p`: one / two accumulators, then `k`:
chunked epilogue stores (block_m 256: 8 KB staging per warpgroup, room for a stage more), then `sN`: N stages, else the
deepest pipeline that fits; then `c`: A multicast over 2-CTA clusters along N; then `g`: one CTA per SM instead of the
balanced grid; no split); with `--clusters` the pick's A multicast
(cluster_n = 2, where N-blocks pair up; with and without balanced_grid) and B multicast (cluster_m = 2) builds.
Default shapes: the twelve M <= 128 DeepSeek-V3 shapes, or with `--clusters` the six M = 4096 ones. One fresh input
per shape, timed interleaved (CUDA graph, L2 flushed, median of 30); every build is checked against float64
(calc_diff) and against the model's output (bitwise where the summation order is the same), DeepGEMM HEAD by
calc_diff. The `est` column is the cost model's
estimate for the build's tile (µs), so a row also says how far the model is off.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from deepgemm.tuning.timing import FlushMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DECODE_SHAPES = [f"{m}x{nk}" for m in (64, 128)
                 for nk in ("2112x7168", "24576x1536", "32768x512", "7168x16384", "4096x7168", "7168x2048")]
PREFILL_SHAPES = ["4096x2112x7168", "4096x24576x1536", "4096x32768x512", "4096x7168x16384", "4096x4096x7168",
                  "4096x7168x2048"]


class Tile(NamedTuple):
    """One `--tiles` entry: the tile, its accumulators (None: make_config's), chunked epilogue stores, its stages
    (None: the deepest pipeline that fits), A multicast over 2-CTA clusters along N, and one CTA per SM instead of
    the balanced grid."""

    block_m: int
    block_n: int
    pipelined: bool | None
    chunked: bool
    stages: int | None
    cluster: bool
    full_grid: bool
    split: bool = False

    @property
    def name(self) -> str:
        accumulators = "" if self.pipelined is None else "up"[self.pipelined]
        stages = "" if self.stages is None else f"s{self.stages}"
        return (f"{self.block_m}x{self.block_n}{accumulators}{'k' * self.chunked}{stages}{'c' * self.cluster}"
                f"{'g' * self.full_grid}{'t' * self.split}")

    def config(self, m: int, n: int, k: int, sms: int):  # noqa: ANN201 - a GemmConfig
        from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config

        config = make_config(m, n, k, self.block_m, self.block_n, sms, num_stages=self.stages,
                             chunked_store=True if self.chunked else None, cluster_n=2 if self.cluster else 1,
                             balanced_grid=False if self.full_grid else None, split_tail=self.split)
        return config if self.pipelined is None else dataclasses.replace(config, pipelined=self.pipelined)


def parse_tile(text: str) -> Tile:
    """'64x192' -> 64 x 192 as make_config builds it; '128x128u' -> one accumulator; '64x128p' -> two; 'k' stores
    the epilogue in chunks ('256x128ks4', block_m 256); 's16' fixes the stage count ('64x16us16'); 'c' runs it as A
    multicast over 2-CTA clusters along N ('64x96c'); 'g' launches one CTA per SM (no balanced grid); a trailing 't'
    cuts a last wave that fills at most half the SMs along K (split tail: '256x128t' at M = 256)."""
    match = re.fullmatch(r"(\d+)x(\d+)([up]?)(k?)(?:s(\d+))?(c?)(g?)(t?)", text)
    if match is None:
        raise SystemExit(f"bad tile {text!r}: BMxBN[u|p][k][sSTAGES][c][g][t]")
    bm, bn, acc, chunked, stages, cluster, full_grid, split = match.groups()
    if chunked and int(bm) != 256:
        raise SystemExit(f"bad tile {text!r}: chunked stores ('k') are a block_m 256 layout")
    return Tile(int(bm), int(bn), {"u": False, "p": True}.get(acc), chunked == "k", int(stages) if stages else None,
                cluster == "c", full_grid == "g", split == "t")


def builds_for(shape: str, tiles: list[Tile], clusters: bool, sms: int) -> list:
    """(name, config) of each build timed for `shape`."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import choose_fp8_gemm_config, max_stages

    m, n, k = (int(v) for v in shape.split("x"))
    model = choose_fp8_gemm_config(m, n, k, sms)
    builds = [("model", model)]
    for tile in tiles:
        deepest = max_stages(tile.block_m, tile.block_n, k, 2, True if tile.chunked else None)
        if deepest < max(2, tile.stages or 0) or (tile.block_m > 64 and m <= 64):
            continue
        if tile.cluster and -(-n // tile.block_n) % 2 != 0:
            continue  # A multicast pairs N-blocks
        config = tile.config(m, n, k, sms)
        if config != model:
            builds.append((tile.name, config))
    plain = not (model.split_tail or model.stream_tail)
    if clusters and -(-n // model.block_n) % 2 == 0 and plain:
        builds.append(("A multicast", dataclasses.replace(model, cluster_n=2)))
        builds.append(("A multicast, all SMs", dataclasses.replace(model, cluster_n=2, balanced_grid=False)))
    if clusters and model.block_n % 16 == 0 and model.block_m != 192 and plain:
        builds.append(("B multicast", dataclasses.replace(model, cluster_m=2)))
    return builds


def estimate_us(m: int, n: int, k: int, config) -> float:  # noqa: ANN001 - a GemmConfig
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import estimate_seconds

    return estimate_seconds(m, n, k, config.block_m, config.block_n, config.num_sms, 2) * 1e6


def main() -> None:
    from deepgemm.tuning.timing import FLUSH_MODES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="*", help="MxNxK")
    parser.add_argument("--tiles", default="", help="comma-separated BMxBN[u|p]")
    parser.add_argument("--clusters", action="store_true", help="the pick's A and B multicast builds too")
    parser.add_argument("--compile-only", action="store_true", help="build and print resources (no GPU needed)")
    parser.add_argument("--sms", type=int, default=None, help="SM count (default: the GPU's, else 132)")
    parser.add_argument("--trees", default="", help="comma-separated packages of other trees (dev/rename_package.sh, "
                        "on PYTHONPATH): each build is also timed from each of them, as BUILD@PACKAGE")
    parser.add_argument("--flush", choices=FLUSH_MODES, default="zero",
                        help="how L2 is flushed before each sample (deepgemm bench --flush)")
    args = parser.parse_args()

    import torch

    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec

    tiles = [parse_tile(t) for t in args.tiles.split(",") if t]
    shapes = args.shapes or (PREFILL_SHAPES if args.clusters else DECODE_SHAPES)
    if args.sms is None and torch.cuda.is_available():
        from deepgemm.kernels.common.device import sm_count

        args.sms = sm_count(0)
    sms = args.sms or 132
    plans = {shape: builds_for(shape, tiles, args.clusters, sms) for shape in shapes}
    specs = {Fp8GemmSpec(n=int(s.split("x")[1]), k=int(s.split("x")[2]), out_dtype=torch.bfloat16, config=c)
             for s, builds in plans.items() for _, c in builds}
    ordered = sorted(specs, key=lambda spec: spec.label())
    trees = [t for t in args.trees.split(",") if t]
    with ThreadPoolExecutor(16) as pool:  # compiles run out of process
        compiled = list(pool.map(compile_spec, ordered))
        list(pool.map(lambda job: job[0](job[1]), [tree_build(tree, spec) for tree in trees for spec in ordered]))
    if args.compile_only:
        for spec, kernel in zip(ordered, compiled):
            print(spec.label(), kernel.resources)
        return
    time_shapes(plans, sms, trees, args.flush)


def tree_config(package: str, config):  # noqa: ANN001, ANN201 - this tree's GemmConfig -> the other tree's
    """`config` as another tree's package's GemmConfig (its own class, the same fields)."""
    import importlib

    config_module = importlib.import_module(f"{package}.kernels.sm90_fp8_gemm_1d2d.config")
    return config_module.GemmConfig(**dataclasses.asdict(config))


def tree_build(package: str, spec):  # noqa: ANN001, ANN201 - a spec of this tree -> (compile, the other tree's spec)
    """The other tree's compile function and its spec of `spec`'s build (compiled ahead, all cores at once)."""
    import importlib

    spec_module = importlib.import_module(f"{package}.kernels.sm90_fp8_gemm_1d2d.spec")
    other = tree_config(package, spec.config)
    return spec_module.compile_spec, spec_module.Fp8GemmSpec(n=spec.n, k=spec.k, out_dtype=spec.out_dtype, config=other)


def tree_plan(package: str, m: int, n: int, k: int, config):  # noqa: ANN001, ANN201 - another tree's GemmConfig / plan
    """`config`'s build from another tree's package."""
    import importlib

    import torch

    plan_module = importlib.import_module(f"{package}.kernels.sm90_fp8_gemm_1d2d.plan")
    return plan_module.get_plan(0, m, n, k, torch.bfloat16, config=tree_config(package, config))


def peer_call(a, b, out):  # noqa: ANN001, ANN201 - our operands, a [M, N] output -> a launch of DeepGEMM HEAD
    """DeepGEMM HEAD's fp8_gemm_nt on our operands into `out`, its scales converted once beforehand (so a call launches
    its GEMM alone)."""
    from deepgemm.bench import deepseek

    (m, k), n = a[0].shape, b[0].shape[0]
    sfa, _ = deepseek.scales(a[1], m, k, is_sfa=True)
    sfb, _ = deepseek.scales(b[1], n, k, is_sfa=False)
    gemm = deepseek.load().fp8_gemm_nt
    return lambda: gemm((a[0], sfa), (b[0], sfb), out)


def time_shapes(plans: dict, sms: int, trees: list[str], flush: "FlushMode" = "zero") -> None:
    import torch

    import deepgemm
    from deepgemm.bench import deepseek
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan
    from deepgemm.tuning.timing import bench_gpu_interleaved
    from tests.helpers import random_operands, reference_fp64

    has_peer = deepseek.missing() is None
    print("| shape | build | config | grid | est µs | µs | TFLOPS | GB/s | vs model | vs DeepGEMM | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape, builds in plans.items():
        m, n, k = (int(v) for v in shape.split("x"))
        a, b = random_operands(m, n, k, "cuda", seed=11)
        ref = reference_fp64(a, b)
        rows, fns, baseline = [], [], None
        runs = builds + [(f"{name}@{tree}", config, tree) for tree in trees for name, config in builds]
        for name, config, *tree in runs:
            try:
                plan = (tree_plan(tree[0], m, n, k, config) if tree
                        else get_plan(0, m, n, k, torch.bfloat16, config=config))
            except (ValueError, RuntimeError) as exc:
                print(f"| {shape} | {name} | {config.label()} | - | - | - | - | - | - | - | {type(exc).__name__}: {exc} |")
                continue
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            plan.launch(a[0], a[1], b[0], b[1], out)
            torch.cuda.synchronize()
            baseline = out.clone() if baseline is None else baseline
            same = "bitwise" if torch.equal(out, baseline) else "differs"
            check = f"{deepgemm.calc_diff(out, ref):.1e} {same}"
            rows.append((name, config.label(), plan.grid, f"{estimate_us(m, n, k, config):.1f}", check))
            fns.append(lambda plan=plan, out=out: plan.launch(a[0], a[1], b[0], b[1], out))
        if has_peer:
            peer_out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            run_peer = peer_call(a, b, peer_out)
            run_peer()
            torch.cuda.synchronize()
            rows.append(("DeepGEMM HEAD", deepseek.version(), "-", "-", f"{deepgemm.calc_diff(peer_out, ref):.1e}"))
            fns.append(run_peer)
        timings = bench_gpu_interleaved(fns, iters=30, warmup=5, flush_mode=flush)
        base_us = timings[0].median_us
        peer_us = timings[-1].median_us if has_peer else None
        gbytes = (m * k + n * k + 2 * m * n) / 1e9
        for (name, label, grid, est, check), t in zip(rows, timings):
            us = t.median_us
            vs_peer = f"{peer_us / us:.3f}" if peer_us else "-"
            print(f"| {shape} | {name} | {label} | {grid} | {est} | {us:.1f} | {2 * m * n * k / us / 1e6:.0f} | "
                  f"{gbytes / us * 1e6:.0f} | {us / base_us:.3f} | {vs_peer} | {check} |", flush=True)


if __name__ == "__main__":
    main()
