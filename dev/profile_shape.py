"""Run one FP8 GEMM shape a few times (for ncu). Usage: profile_shape.py M N K [--peer | --both] [--tile BMxBN]
[--package NAME]

--tile BMxBN runs that tile (deepest pipeline, no split; dev/dense_tile_ab.py's suffixes: `u` / `p` accumulators,
`sN` stages, `c` A multicast, `g` one CTA per SM) instead of the cost model's pick; --peer runs DeepGEMM
HEAD's deep_gemm.fp8_gemm_nt on the same operands instead (scales converted once by its own transform beforehand, so
its GEMM is the only kernel launched per call); --both runs ours and DeepGEMM's alternately in one process on the
same operands (ours first), so counters that depend on where the tensors live (L2 slices, the fabric between the two
L2 halves) compare like with like. --package NAME runs another tree's package instead of this one (renamed by
dev/rename_package.sh, on PYTHONPATH), its cost model's pick or the --tile build."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.helpers, dev.*

import torch  # noqa: E402

import deepgemm  # noqa: E402
from tests.helpers import random_operands  # noqa: E402


def main() -> None:
    m, n, k = (int(v) for v in sys.argv[1:4])
    flags = sys.argv[4:]
    package = flags[flags.index("--package") + 1] if "--package" in flags else None
    a, b = random_operands(m, n, k, "cuda", seed=0)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    calls = []
    if "--peer" in flags or "--both" in flags:
        from dev.dense_tile_ab import peer_call

        calls.append(peer_call(a, b, torch.empty_like(out) if "--both" in flags else out))
    if "--peer" not in flags:
        calls.insert(0, ours_call(m, n, k, a, b, out, package, flags))
    torch.cuda.synchronize()
    for _ in range(3):
        for call in calls:
            call()
    torch.cuda.synchronize()


def ours_call(m: int, n: int, k: int, a, b, out: torch.Tensor, package: str | None, flags: list[str]):  # noqa: ANN001, ANN201
    """Our GEMM on these operands: the --tile build (this tree's or `package`'s) or the public call's pick."""
    if "--tile" in flags:
        from deepgemm.kernels.common.device import sm_count
        from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan
        from dev.dense_tile_ab import parse_tile

        config = parse_tile(flags[flags.index("--tile") + 1]).config(m, n, k, sm_count(0))
        if package is None:
            plan = get_plan(0, m, n, k, torch.bfloat16, config=config)
        else:
            from dev.dense_tile_ab import tree_plan

            plan = tree_plan(package, m, n, k, config)
        return lambda: plan.launch(a[0], a[1], b[0], b[1], out)
    tree = deepgemm if package is None else importlib.import_module(package)
    return lambda: tree.fp8_gemm_nt(a, b, out)


if __name__ == "__main__":
    main()
