"""One BF16 GEMM per layout (a tail in M, N and K) against float64: a first check that the kernel runs at all."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import deepgemm  # noqa: E402
from deepgemm.reference import bf16_gemm_reference  # noqa: E402

torch.manual_seed(0)
for layout in ("nt", "nn", "tn", "tt"):
    for m, n, k in ((200, 136, 200), (4096, 2048, 1024)):
        a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda").to(torch.bfloat16)
        b = torch.randn((n, k) if layout[1] == "t" else (k, n), device="cuda").to(torch.bfloat16)
        out = getattr(deepgemm, f"bf16_gemm_{layout}")(a, b)
        torch.cuda.synchronize()
        diff = deepgemm.calc_diff(out.double(), bf16_gemm_reference(a, b, layout, None, torch.float64))
        print(f"bf16 smoke {layout} {m}x{n}x{k}: calc_diff={diff:.2e} nan={out.isnan().any().item()}", flush=True)
