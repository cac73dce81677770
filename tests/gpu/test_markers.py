"""The quick selection still names real tests (a renamed test would silently leave the quick subset) and is a
proper subset of the full one (`full`: every test marked gpu, tests/gpu/conftest.py). Runs a collection in a subprocess; marked gpu so the check runs where quick matters
(every GPU check), while CPU runs show the same mismatch as a collection warning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.quick]

ROOT = Path(__file__).resolve().parents[2]


def _collect(marker: str) -> tuple[list[str], str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", marker, "tests/gpu"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return [line for line in done.stdout.splitlines() if "::" in line], output


def test_quick_names_collected_tests_and_is_a_subset_of_full() -> None:
    quick, output = _collect("gpu and quick")
    assert "names no collected test" not in output, output[-4000:]
    full, _ = _collect("full")
    assert set(quick) < set(full)
    from tests.gpu.conftest import QUICK

    for pattern in QUICK:  # each pattern selected something
        file, _, test = pattern.partition("::")
        assert any(f"/{file}::{test}" in nodeid if test else f"/{file}::" in nodeid for nodeid in quick), pattern
