"""Measure this GPU's practical ceilings once per run: copy bandwidth and large-matmul throughput."""

from __future__ import annotations

from deepgemm.analysis.gpus import GpuSpec
from deepgemm.analysis.roofline import Ceilings
from deepgemm.tuning.timing import bench_gpu

COPY_BYTES = 2 * 1024**3
MATMUL_SIZE = 8192
_ITERS = 10


def measure_ceilings(device_name: str, fallback: GpuSpec) -> Ceilings:
    """Copy bandwidth (bytes read + written), bf16 and per-tensor fp8 matmul TFLOPS at 8192^3.

    The fp8 figure falls back to ``fallback``'s datasheet value when per-tensor FP8 cannot run here.
    """
    bandwidth_gbs = _copy_bandwidth_gbs()
    bf16_tflops = _bf16_matmul_tflops()
    fp8_tflops = _fp8_matmul_tflops()
    source = f"measured on {device_name}: {COPY_BYTES >> 30} GiB device copy, {MATMUL_SIZE}^3 matmuls"
    if fp8_tflops is None:
        fp8_tflops = fallback.fp8_tflops
        source += f" (fp8 peak from the {fallback.name} datasheet)"
    return Ceilings(bf16_tflops, fp8_tflops, bandwidth_gbs, source)


def _copy_bandwidth_gbs() -> float:
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    # Eager: a memcpy node replayed from a CUDA graph measured only ~2.8 TB/s on an H200, against ~4.3 TB/s
    # for the same cudaMemcpyAsync launched directly (and for a copy kernel inside a graph).
    timing = bench_gpu(lambda: dst.copy_(src), iters=_ITERS, warmup=2, flush_l2=False, use_graph=False)
    return 2 * COPY_BYTES / (timing.median_us * 1e3)


def _tflops(median_us: float) -> float:
    return 2 * MATMUL_SIZE**3 / (median_us * 1e6)


def _bf16_matmul_tflops() -> float:
    import torch

    a = torch.randn((MATMUL_SIZE, MATMUL_SIZE), device="cuda", dtype=torch.bfloat16)
    b = torch.randn((MATMUL_SIZE, MATMUL_SIZE), device="cuda", dtype=torch.bfloat16)
    return _tflops(bench_gpu(lambda: torch.matmul(a, b.t()), iters=_ITERS, warmup=3).median_us)


def _fp8_matmul_tflops() -> float | None:
    import torch

    if not hasattr(torch, "_scaled_mm"):
        return None
    a = torch.randn((MATMUL_SIZE, MATMUL_SIZE), device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn((MATMUL_SIZE, MATMUL_SIZE), device="cuda").to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device="cuda")
    try:
        timing = bench_gpu(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                           iters=_ITERS, warmup=3)
    except RuntimeError:
        return None
    return _tflops(timing.median_us)
