"""scripts/ablate.py patches a copy of the kernel headers by exact text: every variant must still apply."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ablate.py"


def _ablate():  # noqa: ANN202 - the script module
    spec = importlib.util.spec_from_file_location("ablate", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("variant", ["base", "no_promote", "no_mma", "no_loads", "no_store", "mma_only"])
def test_every_ablation_variant_applies(variant: str, tmp_path: Path) -> None:
    ablate = _ablate()
    assert variant in ablate.VARIANTS
    include = ablate.make_include(tmp_path, variant)
    text = (include / ablate.KERNEL).read_text()
    for _, new in ablate.VARIANTS[variant]:
        assert new in text
