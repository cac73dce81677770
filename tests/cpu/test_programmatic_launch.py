"""Programmatic dependent launch (deepgemm.set_pdl): the process-wide switch, the launch configs it selects and the
attribute they carry. (That every kernel waits for the previous grid before touching global memory is checked in the
SASS by the kernel build tests; the GPU tests race a producer kernel against it.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import deepgemm
from deepgemm.jit.driver import driver
from deepgemm.jit.runtime import LoadedKernel, build_launch_config


@pytest.fixture(autouse=True)
def restore_pdl() -> Iterator[None]:
    before = deepgemm.get_pdl()
    yield
    deepgemm.set_pdl(before)


def test_off_by_default_and_switched_by_bools_only() -> None:
    assert deepgemm.get_pdl() is False
    deepgemm.set_pdl(True)
    assert deepgemm.get_pdl() is True
    for bad in (1, 0, "yes", None, 1.0):
        with pytest.raises(TypeError, match="set_pdl: 'enabled' must be a bool"):
            deepgemm.set_pdl(bad)  # type: ignore[arg-type]
    assert deepgemm.get_pdl() is True  # a refused value changes nothing
    deepgemm.set_pdl(False)
    assert deepgemm.get_pdl() is False


def _attributes(config: object) -> dict[str, object]:
    cu = driver()
    found: dict[str, object] = {}
    for attribute in list(config.attrs)[:config.numAttrs]:  # type: ignore[attr-defined]
        if attribute.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
            dim = attribute.value.clusterDim
            found["cluster"] = (dim.x, dim.y, dim.z)
        elif attribute.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
            found["programmatic"] = attribute.value.programmaticStreamSerializationAllowed
        else:
            found[str(attribute.id)] = None
    return found


@pytest.mark.parametrize("cluster", [1, 2])
def test_the_programmatic_config_adds_only_the_serialization_attribute(cluster: int) -> None:
    plain = build_launch_config(0, (132, 1), 384, 200_064, cluster, False)
    programmatic = build_launch_config(0, (132, 1), 384, 200_064, cluster, True)
    clustered = {"cluster": (2, 1, 1)} if cluster == 2 else {}
    assert _attributes(plain) == clustered
    assert _attributes(programmatic) == {**clustered, "programmatic": 1}
    for config in (plain, programmatic):
        assert (config.gridDimX, config.gridDimY, config.blockDimX, config.sharedMemBytes) == (132, 1, 384, 200_064)


def test_each_launch_reads_the_switch() -> None:
    """LoadedKernel.launch takes the (plain, programmatic) pair every launch site caches and picks by the switch at
    the time of the launch (no rebuilt plans, no stale cached configs)."""
    kernel = object.__new__(LoadedKernel)  # no GPU: only what launch() touches
    launched: list[str] = []
    kernel.kernel, kernel.entry, kernel._success = "kernel", "entry", 0
    kernel._launch_ex = lambda config, function, args, extra: (launched.append(config), (0,))[1]
    configs = ("plain", "programmatic")
    kernel.launch(configs, 0)
    deepgemm.set_pdl(True)
    kernel.launch(configs, 0)
    kernel.launch(configs, 0)
    deepgemm.set_pdl(False)
    kernel.launch(configs, 0)
    assert launched == ["plain", "programmatic", "programmatic", "plain"]
