"""The tile schedulers, compiled for the host from the kernel's own headers and run over every CTA.

tile_schedulers_host.cpp stores each scheduled tile the way the FP8 GEMM kernel does and checks that
every output row of every N-block is written exactly once, with its group or as padding, for random
contiguous (m_indices and psum) and masked layouts, block_m 64/128/256, and grids smaller than the tile
count (a CTA then visits one M-block for several N-blocks); and the dense split-tail scheduler covers
every (tile, K block) exactly once with at most one split unit per CTA.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parent.parent / "deepgemm" / "include"


def host_compiler() -> str | None:
    return next((found for name in ("c++", "g++", "clang++") if (found := shutil.which(name))), None)


def test_tile_schedulers_cover_every_row_once(tmp_path: Path) -> None:
    compiler = host_compiler()
    if compiler is None:
        pytest.skip("no host C++ compiler (c++, g++ or clang++) on PATH")
    binary = tmp_path / "tile_schedulers_host"
    build = subprocess.run([compiler, "-std=c++17", "-O2", "-Wall", "-Werror", f"-I{INCLUDE}",
                            str(HERE / "tile_schedulers_host.cpp"), "-o", str(binary)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("failures: 0"), run.stdout[-3000:]
