"""GPU spec table and the roofline estimate."""

from __future__ import annotations

import pytest

from deepgemm.analysis.gpus import GPUS, get_gpu, match_device_name
from deepgemm.analysis.roofline import Ceilings, estimate


def test_gpu_table_is_consistent() -> None:
    for spec in GPUS.values():
        assert spec.bf16_tflops > 0 and spec.hbm_gbs > 0 and spec.num_sms > 0
        if spec.fp8_tflops is not None:
            assert spec.fp8_tflops == pytest.approx(2 * spec.bf16_tflops, rel=0.01)
    assert get_gpu("H100").key == "h100-sxm"
    assert get_gpu("h200").num_sms == 132
    with pytest.raises(ValueError, match="unknown GPU 'v100'"):
        get_gpu("v100")
    with pytest.raises(ValueError, match="no FP8"):
        Ceilings.from_spec(get_gpu("a100")).tflops("fp8")


def test_device_names_map_to_specs() -> None:
    assert match_device_name("NVIDIA H200").key == "h200"
    assert match_device_name("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert match_device_name("NVIDIA H20").key == "h20"
    assert match_device_name("Tesla T4") is None


def test_roofline_bound_and_ridge() -> None:
    ceilings = Ceilings(bf16_tflops=1000.0, fp8_tflops=2000.0, bandwidth_gbs=4000.0, source="test")
    assert ceilings.ridge_intensity("fp8") == pytest.approx(500.0)
    big = estimate(flops=2 * 4096**3, num_bytes=3 * 4096**2, precision="fp8", ceilings=ceilings)
    assert big.bound == "compute" and big.time_s == pytest.approx(2 * 4096**3 / 2e15)
    skinny = estimate(flops=2 * 1 * 4096 * 4096, num_bytes=4096 * 4096, precision="fp8", ceilings=ceilings)
    assert skinny.bound == "memory" and skinny.time_s == pytest.approx(4096 * 4096 / 4e12)
    assert ceilings.attainable_tflops(100.0, "bf16") == pytest.approx(400.0)
    assert ceilings.attainable_tflops(1e6, "bf16") == pytest.approx(1000.0)
