"""Autotuner: time candidate tile choices for one FP8 GEMM shape on the GPU and keep the fastest.

Candidates are the cost model's best tiles plus their 2-CTA-cluster variants. Each is compiled (in
parallel, out of process), launched on fresh random operands, timed with CUDA-graph replay and an L2
flush (median of `iters`), its output checked against a float32 product (tuning.verify: a wrong build is
left out, never recorded), and the winner is recorded in the GPU model's tuning file, which
`fp8_gemm_nt` consults before the cost model.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from deepgemm.errors import UnsupportedError
from deepgemm.jit.runtime import refuse_during_capture
from deepgemm.kernels.common.device import is_sm90, sm_count
from deepgemm.kernels.common.hopper import elem_bytes
from deepgemm.kernels.quantize_fp8.launch import quantize_per_block_cuda, quantize_per_token_group_cuda
from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import clusters_allowed, make_config, ranked_candidates
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan
from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import model_split_tail, split_tail_applies, stream_tail_applies
from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec
from deepgemm.reference import fp8_gemm_nt_reference
from deepgemm.tuning.db import tuning_db
from deepgemm.tuning.timing import bench_gpu
from deepgemm.tuning.verify import candidate_error, settle


@dataclass(frozen=True)
class TuneResult:
    best: GemmConfig
    timings_us: tuple[tuple[GemmConfig, float], ...]  # fastest first, every one checked against float32
    db_path: str
    rejected: tuple[tuple[GemmConfig, float], ...] = ()  # (config, calc_diff): wrong output, never recorded


def candidate_configs(m: int, n: int, k: int, num_sms: int, out_elem_bytes: int, top: int) -> list[GemmConfig]:
    configs: list[GemmConfig] = []
    # block_m 192 too, which the cost model leaves out (it was never the fastest tile in its sweep).
    for _, block_m, block_n in ranked_candidates(m, n, k, num_sms, out_elem_bytes, allow_block_m_192=True)[:top]:
        model_split = model_split_tail(m, n, k, block_m, block_n, num_sms)
        configs.append(make_config(m, n, k, block_m, block_n, num_sms, out_elem_bytes, cluster_m=1, split_tail=model_split))
        if not model_split and split_tail_applies(m, n, k, block_m, block_n, num_sms):
            configs.append(make_config(m, n, k, block_m, block_n, num_sms, out_elem_bytes, cluster_m=1, split_tail=True))
        if stream_tail_applies(m, n, k, block_m, block_n, num_sms):
            configs.append(make_config(m, n, k, block_m, block_n, num_sms, out_elem_bytes, cluster_m=1, stream_tail=True))
        if clusters_allowed(m, block_m, block_n, num_sms):
            configs.append(make_config(m, n, k, block_m, block_n, num_sms, out_elem_bytes, cluster_m=2))
    return configs


def tune_fp8_gemm_nt(m: int, n: int, k: int, *, out_dtype: torch.dtype = torch.bfloat16, device: int | None = None,
                     top: int = 6, iters: int = 20, num_sms: int | None = None) -> TuneResult:
    """Measure the candidates for (m, n, k) on an sm_90 GPU and record the fastest, for `num_sms` SMs (None: the
    device's, under the DEEPGEMM_NUM_SMS cap; the entry is keyed by it, as fp8_gemm_nt(num_sms=) looks it up)."""
    index = torch.cuda.current_device() if device is None else device
    if not torch.cuda.is_available() or not is_sm90(index):
        raise UnsupportedError("tuning needs an sm_90 (Hopper) GPU")
    refuse_during_capture(f"tuning fp8_gemm_nt m={m} n={n} k={k}", index)
    num_sms = sm_count(index) if num_sms is None else num_sms
    out_elem_bytes = elem_bytes(out_dtype)
    configs = candidate_configs(m, n, k, num_sms, out_elem_bytes, top)
    with ThreadPoolExecutor(max_workers=min(8, len(configs))) as pool:
        list(pool.map(lambda c: compile_spec(Fp8GemmSpec(n, k, out_dtype, c)), configs))
    with torch.cuda.device(index):
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
        w = torch.randn(n, k, generator=gen).to("cuda", torch.bfloat16)
        a = quantize_per_token_group_cuda(x, 128)
        b = quantize_per_block_cuda(w, 128)
        out = torch.empty(m, n, dtype=out_dtype, device="cuda")
        reference = fp8_gemm_nt_reference(a[0], a[1], b[0], b[1])
        timings, rejected = [], []
        for config in configs:
            plan = get_plan(index, m, n, k, out_dtype, config)
            out.fill_(float("nan"))
            timing = bench_gpu(lambda: plan.launch(a[0], a[1], b[0], b[1], out), iters=iters, warmup=3)
            error = candidate_error(out, reference)
            if error is None:
                timings.append((config, timing.median_us))
            else:
                rejected.append((config, error))
    settle("fp8_gemm_nt", timings, rejected, f"m={m} n={n} k={k}")
    timings.sort(key=lambda item: item[1])
    best, best_us = timings[0]
    db = tuning_db(torch.cuda.get_device_name(index))
    db.record(m, n, k, num_sms, best, best_us, out_elem_bytes)
    return TuneResult(best=best, timings_us=tuple(timings), db_path=str(db.path), rejected=tuple(rejected))
