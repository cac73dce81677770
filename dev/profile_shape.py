"""Run one FP8 GEMM shape a few times (for ncu). Usage: profile_shape.py M N K"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.helpers, dev.*

import torch  # noqa: E402

import deepgemm  # noqa: E402
from tests.helpers import random_operands  # noqa: E402


def main() -> None:
    m, n, k = (int(v) for v in sys.argv[1:4])
    a, b = random_operands(m, n, k, "cuda", seed=0)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        deepgemm.fp8_gemm_nt(a, b, out)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
