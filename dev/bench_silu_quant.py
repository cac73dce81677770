"""silu_mul_quantize_per_token_group (one pass) against torch's silu(gate) * up followed by quantize_per_token_group,
interleaved (graph replay, L2 flushed, median of 30), with the fused kernel's accuracy against float64."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import deepgemm  # noqa: E402
from deepgemm.tuning.timing import bench_gpu_interleaved  # noqa: E402

SHAPES = [(1, 768), (64, 768), (4096, 768), (32768, 768), (4096, 2048), (32768, 2048), (4096, 14336)]  # (M, I)
COPY_GBS = 4300.0


def unfused(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = x.chunk(2, dim=1)
    return deepgemm.quantize_per_token_group(F.silu(gate) * up)


def main() -> None:
    torch.manual_seed(0)
    print("| M × I | fused µs | fused GB/s (% of copy) | torch act + quantize µs | torch act alone µs | unfused / fused | "
          "calc_diff vs float64 |")
    print("|---|---|---|---|---|---|---|")
    for m, i in SHAPES:
        x = (torch.randn(m, 2 * i, device="cuda") * 3).to(torch.bfloat16)
        q, sf = deepgemm.silu_mul_quantize_per_token_group(x)
        gate, up = x.double().chunk(2, dim=1)
        diff = deepgemm.calc_diff(deepgemm.dequantize_per_token_group(q, sf, dtype=torch.float64), F.silu(gate) * up)
        fused, two, act = bench_gpu_interleaved(
            [lambda: deepgemm.silu_mul_quantize_per_token_group(x), lambda: unfused(x),
             lambda: F.silu(x[:, :i]) * x[:, i:]], iters=30)
        moved = m * 2 * i * 2 + m * i + m * -(-i // 128) * 4
        gbs = moved / fused.median_us / 1e3
        print(f"| {m} × {i} | {fused.median_us:.1f} | {gbs:.0f} ({100 * gbs / COPY_GBS:.0f}%) | {two.median_us:.1f} | "
              f"{act.median_us:.1f} | {two.median_us / fused.median_us:.2f} | {diff:.1e} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
