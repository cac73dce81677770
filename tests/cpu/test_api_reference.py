"""docs/api.md is what dev/gen_api_reference.py generates from the docstrings, and every public docstring follows
its convention: arguments, errors and an example for each function and class (layouts for the GEMMs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dev import gen_api_reference as gen

ROOT = Path(__file__).resolve().parents[2]


def test_api_reference_is_up_to_date() -> None:
    expected = gen.render()
    current = gen.TARGET.read_text() if gen.TARGET.exists() else ""
    assert current == expected, f"docs/api.md differs from the docstrings; regenerate it: {gen.COMMAND}"


def test_every_public_docstring_follows_the_convention() -> None:
    problems = gen.problems()
    assert not problems, "\n".join(problems) + f"\n(the convention: dev/gen_api_reference.py's docstring; then run "\
                                               f"{gen.COMMAND})"


def test_every_public_name_is_on_the_page() -> None:
    import deepgemm
    import deepgemm.distributed
    import deepgemm.nn

    page = gen.render()
    for module in (deepgemm, deepgemm.nn, deepgemm.distributed):
        for name in module.__all__:
            assert f"`{module.__name__}.{name}`" in page, f"{module.__name__}.{name} is not on the page"


def test_rendering_is_deterministic_and_has_no_addresses() -> None:
    first, second = gen.render(), gen.render()
    assert first == second
    assert " at 0x" not in first and str(ROOT) not in first


def test_the_checker_catches_a_broken_docstring() -> None:
    def sample(x: int, *, flag: bool = False) -> int:
        """Add one.

        Args:
            x: the value.

        Example::

            deepgemm.fp8_gemm_nt(a, b, out, out_dtyp=torch.float32)
            deepgemm.no_such_function(1)
        """
        return x + 1

    found = gen.entry_problems(gen.Entry("deepgemm.sample", sample, "Utilities"))
    assert any("'flag' has no item" in p for p in found), found
    assert any("no 'Raises:' section" in p for p in found), found
    assert any("out_dtyp" in p for p in found), found
    assert any("no_such_function" in p for p in found), found
    assert any("never uses sample" in p for p in found), found


def test_check_command_passes() -> None:
    done = subprocess.run([sys.executable, "dev/gen_api_reference.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
