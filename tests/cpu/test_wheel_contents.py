"""The built wheel carries everything the package reads at run time: an editable install (what CI uses) reads the
source tree and would not notice a package-data glob that misses a moved file."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    pytest.importorskip("setuptools", reason="setuptools comes with the [test] extra")
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                           str(ROOT)], capture_output=True, text=True, timeout=600, cwd=build)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheels = list(out.glob("deepgemm-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        return set(wheel.namelist())


def package_files(pattern: str) -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "deepgemm").rglob(pattern) if "__pycache__" not in p.parts)


def test_wheel_has_every_header_table_and_module(wheel_names: set[str]) -> None:
    expected = package_files("*.cuh") + package_files("*.json") + package_files("*.py") + ["deepgemm/py.typed"]
    assert len(package_files("*.cuh")) >= 10 and package_files("*.json"), "the source tree moved: update this test"
    missing = [name for name in expected if name not in wheel_names]
    assert not missing, f"missing from the wheel: {missing}"


def test_wheel_leaves_out_dev_and_tests(wheel_names: set[str]) -> None:
    stray = [name for name in wheel_names if name.startswith(("dev/", "tests/", "scripts/", "benchmarks/"))]
    assert not stray, stray
