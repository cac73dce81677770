"""Run one BF16 GEMM shape a few times (for ncu). Usage: profile_bf16.py M N K [--layout L] [--tile BMxBN[w|k]]
[--peer]

--tile runs that tile with as many stages as fit, its epilogue as the model would stage it (`w`: one whole-tile
staging buffer; `k`: chunks of store_chunk_columns), instead of the cost model's pick; --peer runs DeepGEMM HEAD's
bf16_gemm_<layout> on the same operands instead. Kernels: ours `deepgemm_bf16_gemm`, DeepGEMM's `sm90_bf16_gemm`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402


def main() -> None:
    m, n, k = (int(v) for v in sys.argv[1:4])
    flags = sys.argv[4:]
    layout = flags[flags.index("--layout") + 1] if "--layout" in flags else "nt"
    torch.manual_seed(0)
    a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda").to(torch.bfloat16)
    b = torch.randn((n, k) if layout[1] == "t" else (k, n), device="cuda").to(torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if "--peer" in flags:
        from deepgemm.bench import deepseek

        peer = getattr(deepseek.load(), f"bf16_gemm_{layout}")
        call = lambda: peer(a, b, out)  # noqa: E731
    else:
        call = ours(m, n, k, layout, a, b, out, flags[flags.index("--tile") + 1] if "--tile" in flags else None)
    for _ in range(3):
        call()
    torch.cuda.synchronize()


def ours(m: int, n: int, k: int, layout: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tile: str | None):  # noqa: ANN201
    import deepgemm
    from deepgemm.kernels.common.device import sm_count
    from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config
    from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem, get_bf16_plan
    from dev.bench_bf16_split import with_staging

    if tile is None:
        return lambda: getattr(deepgemm, f"bf16_gemm_{layout}")(a, b, out)
    mode = tile[-1] if tile[-1] in "wk" else ""
    bm, bn = (int(v) for v in tile.rstrip("wk").split("x"))
    problem = bf16_problem(m, n, k, layout, torch.bfloat16, None, sm_count(0))
    config = make_config(problem, bm, bn)
    if mode:
        config = with_staging(config, mode, 2)
    print(f"ours {m}x{n}x{k} {layout}: {config.label()}", flush=True)
    plan = get_bf16_plan(0, m, n, k, layout, torch.bfloat16, None, config)
    return lambda: plan.launch(a, b, out)


if __name__ == "__main__":
    main()
