"""Autotuner of the BF16 GEMM: time the cost model's best tiles for one shape and layout on the GPU, keep the fastest.

Each candidate is compiled (in parallel, out of process), launched on fresh random operands in the layout's stored
form, timed with CUDA-graph replay and an L2 flush (median of `iters`), its output checked against a float32 product
(tuning.verify: a wrong build is left out, never recorded), and the winner is recorded in the GPU model's tuning
file, which `bf16_gemm_<layout>` consults before the cost model.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from deepgemm.errors import UnsupportedError
from deepgemm.jit.runtime import refuse_during_capture
from deepgemm.kernels.common.device import is_sm90, sm_count
from deepgemm.kernels.sm90_bf16_gemm.config import Bf16GemmConfig
from deepgemm.kernels.sm90_bf16_gemm.cost_model import ranked_configs
from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem, get_bf16_plan
from deepgemm.kernels.sm90_bf16_gemm.spec import LAYOUTS, Bf16GemmSpec, addend_kind, compile_spec
from deepgemm.reference import bf16_gemm_reference
from deepgemm.tuning.db import tuning_db
from deepgemm.tuning.timing import bench_gpu
from deepgemm.tuning.verify import candidate_error, settle


@dataclass(frozen=True)
class Bf16TuneResult:
    best: Bf16GemmConfig
    timings_us: tuple[tuple[Bf16GemmConfig, float], ...]  # fastest first, every one checked against float32
    db_path: str
    rejected: tuple[tuple[Bf16GemmConfig, float], ...] = ()  # (config, calc_diff): wrong output, never recorded


def tune_bf16_gemm(layout: str, m: int, n: int, k: int, *, out_dtype: torch.dtype = torch.bfloat16,
                   c_dtype: torch.dtype | None = None, device: int | None = None, top: int = 8, iters: int = 20,
                   num_sms: int | None = None) -> Bf16TuneResult:
    """Measure the cost model's `top` tiles for bf16_gemm_<layout> at M x N x K on an sm_90 GPU and record the
    fastest, for `num_sms` SMs (None: the device's, under the DEEPGEMM_NUM_SMS cap) and this output / addend dtype
    (`c_dtype` None: no C)."""
    if layout not in LAYOUTS:
        raise ValueError(f"tune_bf16_gemm: 'layout' must be one of {LAYOUTS}, got {layout!r}")
    index = torch.cuda.current_device() if device is None else device
    if not torch.cuda.is_available() or not is_sm90(index):
        raise UnsupportedError("tuning needs an sm_90 (Hopper) GPU")
    refuse_during_capture(f"tuning bf16_gemm_{layout} m={m} n={n} k={k}", index)
    problem = bf16_problem(m, n, k, layout, out_dtype, c_dtype, sm_count(index) if num_sms is None else num_sms)
    configs = [config for _, config in ranked_configs(problem)[:top]]
    if not configs:
        raise UnsupportedError(f"no BF16 tile fits shared memory for {problem}")
    addend = addend_kind(c_dtype)
    with ThreadPoolExecutor(max_workers=min(8, len(configs))) as pool:
        list(pool.map(lambda c: compile_spec(Bf16GemmSpec(n, k, layout, out_dtype, addend, c)), configs))
    with torch.cuda.device(index):
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn((m, k) if layout[0] == "n" else (k, m), generator=gen).to("cuda", torch.bfloat16)
        b = torch.randn((n, k) if layout[1] == "t" else (k, n), generator=gen).to("cuda", torch.bfloat16)
        c = None if c_dtype is None else torch.randn(m, n, generator=gen).to("cuda", c_dtype)
        out = torch.empty(m, n, dtype=out_dtype, device="cuda")
        reference = bf16_gemm_reference(a, b, layout, c)
        timings, rejected = [], []
        for config in configs:
            plan = get_bf16_plan(index, m, n, k, layout, out_dtype, c_dtype, config)
            out.fill_(float("nan"))
            timing = bench_gpu(lambda: plan.launch(a, b, out, c), iters=iters, warmup=3)
            error = candidate_error(out, reference)
            if error is None:
                timings.append((config, timing.median_us))
            else:
                rejected.append((config, error))
    settle(f"bf16_gemm_{layout}", timings, rejected, f"m={m} n={n} k={k}")
    timings.sort(key=lambda item: item[1])
    best, best_us = timings[0]
    db = tuning_db(torch.cuda.get_device_name(index))
    db.record_bf16(problem, best, best_us)
    return Bf16TuneResult(best=best, timings_us=tuple(timings), db_path=str(db.path), rejected=tuple(rejected))
