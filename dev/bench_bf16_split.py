"""BF16 NT at decode sizes: the cost model's pick, its best plain (unsplit) tile and split-K builds of a few tiles,
against cuBLAS (torch.matmul) and DeepGEMM HEAD (when importable), all interleaved in one run on the same operands
(CUDA-graph replay, L2 flushed before each call, median of 30). Each output is checked against float64.
Prints a markdown table: µs, GB/s (A + B + D once), % of the 4.3 TB/s copy rate, best peer µs / ours.
Usage: bench_bf16_split.py [--layout=L] [--flush=zero|read] [MxNxK[:bm,bn[,s];...] ...]
(default: the DeepSeek-V3 decode shapes and a few Llama / Qwen ones; --flush=read flushes L2 by reading, as
`deepgemm bench --flush read`); explicit tiles are plain, split-K with ",s", plain on the full grid with ",u", plain
with a chunked epilogue with ",k" (store_chunk_columns, and as many stages as then fit), or plain with one whole-tile
staging buffer with ",w"; a pick with a balanced grid is also timed on the full grid.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT = [f"{m}x{n}x{k}" for m in (64, 128) for n, k in
           [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]]
DEFAULT += ["1x2112x7168", "1x4096x7168", "16x4096x14336", "16x6144x4096", "128x3584x18944", "128x4096x4096"]
SPLIT_TILES = [(64, 64), (64, 128)]
COPY_BYTES_PER_S = 4.3e12


def candidates(m: int, n: int, k: int, layout: str, sms: int,
               explicit: list[tuple[int, int, str]]) -> list[tuple[str, Any]]:
    """(name, config): the model's pick, its best plain tile (if the pick splits), split builds that split, the pick
    on the full grid (if its grid is balanced), and the explicit tiles ("s": split-K, "u": on the full grid)."""
    from deepgemm.kernels.common.split_scratch import split_tail_ranges
    from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config, ranked_configs
    from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem
    from deepgemm.utils import ceil_div

    import torch

    problem = bf16_problem(m, n, k, layout, torch.bfloat16, None, sms)
    ranked = [c for _, c in ranked_configs(problem)]
    out = [("model", ranked[0])]
    if ranked[0].split_k:
        out.append(("plain", next(c for c in ranked if not c.split_k)))
    for bm, bn in SPLIT_TILES if m <= 128 else []:
        if bm == 128 and m <= 64:
            continue
        tiles = ceil_div(m, bm) * ceil_div(n, bn)
        if split_tail_ranges(tiles, sms, ceil_div(k, 64)) > 1:
            config = make_config(problem, bm, bn, split_k=True)
            if config != ranked[0]:
                out.append(("split", config))
    if ranked[0].balanced_grid:
        out.append(("full grid", dataclasses.replace(ranked[0], balanced_grid=False)))
    for bm, bn, mode in explicit:
        config = make_config(problem, bm, bn, split_k=mode == "s")
        if mode == "u":
            config = dataclasses.replace(config, balanced_grid=False)
        if mode in ("k", "w"):
            config = with_staging(config, mode, problem.out_bytes)
        out.append(({"s": "split", "k": "chunked", "w": "whole"}.get(mode, "tile"), config))
    return out


def with_staging(config: Any, mode: str, out_bytes: int) -> Any:
    """`config` with its epilogue forced: "k" chunked (store_chunk_columns), "w" one whole-tile staging buffer; as
    many stages as then fit."""
    from deepgemm.kernels.sm90_bf16_gemm.config import store_chunk_columns
    from deepgemm.kernels.sm90_bf16_gemm.cost_model import stages_for

    store_n = store_chunk_columns(config.block_n, out_bytes) if mode == "k" else 0
    return dataclasses.replace(config, store_n=store_n,
                               num_stages=stages_for(config.block_m, config.block_n, out_bytes, store_n=store_n))


def main() -> None:
    import torch

    import deepgemm
    from deepgemm.bench import deepseek
    from deepgemm.kernels.common.device import sm_count
    from deepgemm.kernels.sm90_bf16_gemm.plan import get_bf16_plan
    from deepgemm.tuning.timing import FLUSH_MODES, bench_gpu_interleaved

    from deepgemm.bench.peers import CUBLAS_BF16_PRODUCTS

    args = sys.argv[1:]
    layout = next((a.split("=", 1)[1] for a in args if a.startswith("--layout=")), "nt")
    flush = next((a.split("=", 1)[1] for a in args if a.startswith("--flush=")), "zero")
    if flush not in FLUSH_MODES:
        raise SystemExit(f"--flush={flush}: one of {', '.join(FLUSH_MODES)}")
    specs = [a for a in args if not a.startswith("--")] or DEFAULT
    product = CUBLAS_BF16_PRODUCTS[layout][1]
    try:
        peer = getattr(deepseek.load(), f"bf16_gemm_{layout}")
    except deepseek.PeerMissing as exc:
        print(f"DeepGEMM HEAD not timed: {exc}")
        peer = None
    sms = sm_count(0)
    torch.manual_seed(0)
    print("| shape | impl | config | splits | µs | GB/s | % copy | best peer / this | calc_diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in specs:
        shape, _, tiles = spec.partition(":")
        explicit = [(int(t.split(",")[0]), int(t.split(",")[1]), t.split(",")[2] if t.count(",") > 1 else "")
                    for t in tiles.split(";") if t]
        m, n, k = (int(v) for v in shape.split("x"))
        a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda").to(torch.bfloat16)
        b = torch.randn((n, k) if layout[1] == "t" else (k, n), device="cuda").to(torch.bfloat16)
        ref = product(a.double(), b.double())
        rows: list[tuple[str, str, int, Any]] = []
        fns: list[Callable[[], Any]] = []
        for name, config in candidates(m, n, k, layout, sms, explicit):
            plan = get_bf16_plan(0, m, n, k, layout, torch.bfloat16, None, config)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            rows.append((name, config.label(), plan.splits, out))
            fns.append(functools.partial(plan.launch, a, b, out))
        cublas_out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        rows.append(("cublas", "torch.matmul", 1, cublas_out))
        a_view, b_view = a if layout[0] == "n" else a.t(), b.t() if layout[1] == "t" else b  # D = a_view @ b_view
        fns.append(lambda: torch.matmul(a_view, b_view, out=cublas_out))
        if peer is not None:
            peer_out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            rows.append(("deepgemm-head", f"bf16_gemm_{layout}", 1, peer_out))
            fns.append(lambda: peer(a, b, peer_out))
        for fn in fns:
            fn()
        torch.cuda.synchronize()
        timings = bench_gpu_interleaved(fns, iters=30, warmup=5, flush_mode=flush)
        best_peer = min(t.median_us for (name, *_), t in zip(rows, timings) if name in ("cublas", "deepgemm-head"))
        moved = (m * k + n * k + m * n) * 2
        for (name, label, splits, out), t in zip(rows, timings):
            us = t.median_us
            print(f"| {shape} | {name} | {label} | {splits} | {us:.1f} | {moved / us / 1e3:.0f} | "
                  f"{100 * moved / us / 1e-6 / COPY_BYTES_PER_S:.0f} | {best_peer / us:.2f} | "
                  f"{deepgemm.calc_diff(out.double(), ref):.1e} |", flush=True)


if __name__ == "__main__":
    main()
