"""sass_freeze adapter for the tree at 34e2317 (deepgemm.kernels.fp8_gemm, deepgemm.configs)."""
from dataclasses import replace

import torch

from deepgemm.configs.heuristics import contiguous_tile, make_config, masked_config_m, masked_tile
from deepgemm.kernels import kgrouped, quantize
from deepgemm.kernels.fp8_gemm import Fp8GemmSpec, GemmKind, plan_spec, render_source

SMS = 132
OUT = {"bf16": torch.bfloat16, "fp32": torch.float32}
KINDS = {"contiguous": GemmKind.GROUPED_CONTIGUOUS, "psum": GemmKind.GROUPED_CONTIGUOUS_PSUM,
         "masked": GemmKind.GROUPED_MASKED}


def source(case):
    kind = case["kind"]
    if kind == "dense":
        out = OUT[case["out"]]
        ebytes = 4 if out == torch.float32 else 2
        if "tile" in case:
            e = case["extra"]
            config = make_config(case["m"], case["n"], case["k"], *case["tile"], SMS, ebytes,
                                 cluster_m=e.get("cluster_m", 1), split_tail=e.get("split_tail", False),
                                 stream_tail=e.get("stream_tail", False))
            spec = Fp8GemmSpec(case["n"], case["k"], out, config)
        else:
            spec = plan_spec(case["m"], case["n"], case["k"], out, SMS, case["gpu"])
            if case.get("wide_last_n"):
                spec = replace(spec, narrow_last_n=False)
        return spec.label(), render_source(spec)
    if kind in KINDS:
        out = OUT[case["out"]]
        ebytes = 4 if out == torch.float32 else 2
        n, k, g = case["n"], case["k"], case["groups"]
        if kind == "masked":
            work_m = masked_config_m(case["expected_m"], case["max_m"])
            bm, bn = masked_tile(work_m, g, n, k, SMS, ebytes)
        else:
            work_m = case["m_total"]
            bm, bn = contiguous_tile(work_m, g, n, k, SMS, ebytes)
        config = make_config(max(work_m, 1), n, k, bm, bn, SMS, ebytes, cluster_m=1)
        spec = Fp8GemmSpec(n=n, k=k, out_dtype=out, config=config, kind=KINDS[kind])
        return spec.label(), render_source(spec)
    if kind == "kgrouped":
        spec = kgrouped.KGroupedSpec.for_shape(case["m"], case["n"])
        return spec.label(), kgrouped.render_source(spec)
    dtype = getattr(torch, case["dtype"])
    if kind == "quantize_token_group":
        src = quantize._token_group_source(dtype, case["size"])
    else:
        src = quantize._block_source(dtype, case["size"])
    return src.label, src
