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


@pytest.mark.parametrize("variant", list(_ablate().VARIANTS))
def test_every_ablation_variant_applies(variant: str, tmp_path: Path) -> None:
    ablate = _ablate()
    include = ablate.make_include(tmp_path, variant)
    text = (include / ablate.KERNEL).read_text()
    for _, new in ablate.VARIANTS[variant]:
        assert new in text


@pytest.mark.parametrize("script,env", [("trace_consumer", {}), ("tail_trace", {}), ("tail_trace", {"TAIL_EPILOGUE": "1"})])
def test_trace_patches_apply(script: str, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock64/%globaltimer trace scripts patch the same header by exact text: their stamps must still apply."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location(script, SCRIPT.parent / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = (tmp_path, "") if script == "trace_consumer" else (tmp_path,)
    text = (module.make_include(*args) / _ablate().KERNEL).read_text()
    patches = module.EPILOGUE_PATCHES if env.get("TAIL_EPILOGUE") == "1" else module.PATCHES
    for _, new in patches:
        assert new in text
