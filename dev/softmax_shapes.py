"""The fused softmax on explicit row groups (threads a row, vectors a thread, cluster CTAs, streaming) against
softmax_shape's pick and a device copy of the same bytes, interleaved (CUDA-graph replay, L2 flushed, median of 30),
each build's output compared with the pick's: the data behind softmax_shape's rules."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from deepgemm.kernels.softmax.launch import SoftmaxShape, softmax_forward_cuda, softmax_shape  # noqa: E402
from deepgemm.kernels.common.device import physical_sm_count  # noqa: E402
from deepgemm.tuning.timing import bench_gpu_interleaved  # noqa: E402

BF16, FP32 = torch.bfloat16, torch.float32

# (label, rows, n, dtype, causal query rows or 0)
CASES = [
    ("decode 2048 x 8192", 2048, 8192, BF16, 1),
    ("attention 32 x 1024 x 1024 causal", 32 * 1024, 1024, BF16, 1024),
    ("16384 x 4096 fp32", 16384, 4096, FP32, 0),
    ("MoE router 16384 x 256 fp32", 16384, 256, FP32, 0),
    ("attention 32 x 2048 x 2048", 32 * 2048, 2048, BF16, 0),
    ("vocab 512 x 32000", 512, 32000, BF16, 0),
    ("vocab 64 x 128256 fp32", 64, 128256, FP32, 0),
    ("vocab 512 x 128256 bf16", 512, 128256, BF16, 0),
    ("vocab 16 x 262144", 16, 262144, BF16, 0),
    ("8 x 1048576 fp32", 8, 1048576, FP32, 0),
]


def candidates(n: int, dtype: torch.dtype, rows: int = 1, num_sms: int = 132) -> dict[str, SoftmaxShape]:
    pick = softmax_shape(n, dtype, True, rows=rows, num_sms=num_sms)
    vector = pick.vector
    out = {"pick": pick}
    if not pick.streaming and pick.cluster == 1 and pick.threads_per_row >= 2 and pick.items <= 4:
        out["half threads, 2x items"] = dataclasses.replace(pick, threads_per_row=pick.threads_per_row // 2,
                                                            items=pick.items * 2)
    if not pick.streaming and pick.cluster == 1 and pick.threads_per_row <= 512:
        out["2 rows in flight"] = dataclasses.replace(pick, rows_in_flight=2)
    if not pick.streaming and pick.cluster == 1 and pick.items >= 2 and pick.threads_per_row < 1024:
        out["2x threads, half items"] = dataclasses.replace(pick, threads_per_row=min(1024, pick.threads_per_row * 2),
                                                            items=pick.items // 2)
    per_cta = 1024 * 4 * vector
    if n > per_cta:
        out["streaming, 1 CTA"] = SoftmaxShape(1024, 4, vector, True, 1)
        out["streaming, 512 threads x 8"] = SoftmaxShape(512, 8, vector, True, 1)
        for cluster in (2, 4, 8):
            if cluster * per_cta >= n and cluster != pick.cluster:
                out[f"cached, cluster {cluster}"] = SoftmaxShape(1024, 4, vector, False, cluster)
            if cluster * 512 * 8 * vector >= n:
                out[f"cached, cluster {cluster}, 512 threads x 8"] = SoftmaxShape(512, 8, vector, False, cluster)
        if not pick.streaming or pick.cluster != 8:
            out["streaming, cluster 8"] = SoftmaxShape(1024, 4, vector, True, 8)
    return out


def main() -> None:
    torch.manual_seed(0)
    print("| case | build | threads x items x vector, cluster | µs | copy µs | copy / build | max diff vs pick |")
    print("|---|---|---|---|---|---|---|")
    for label, rows, n, dtype, sq in CASES:
        x = (torch.randn(rows, n, device="cuda") * 3).to(dtype)
        copy_out = torch.empty_like(x)
        builds = candidates(n, dtype, rows, physical_sm_count(0))
        outs = {name: torch.empty_like(x) for name in builds}

        def run(name: str) -> None:
            softmax_forward_cuda(x, outs[name], 0.5, sq > 0, max(sq, 1), builds[name])

        for name in builds:
            run(name)
        fns = [lambda: copy_out.copy_(x)] + [lambda name=name: run(name) for name in builds]
        times = bench_gpu_interleaved(fns, iters=30)
        copy = times[0].median_us
        for (name, shape), timing in zip(builds.items(), times[1:]):
            diff = (outs[name].float() - outs["pick"].float()).abs().max().item()
            layout = (f"{shape.threads_per_row} x {shape.items} x {shape.vector}, {shape.cluster}"
                      f"{', streaming' if shape.streaming else ''}"
                      f"{f', {shape.rows_in_flight} rows' if shape.rows_in_flight > 1 else ''}")
            print(f"| {label} | {name} | {layout} | {timing.median_us:.1f} | {copy:.1f} | "
                  f"{copy / timing.median_us:.2f} | {diff:.1e} |")
        sys.stdout.flush()
        del x, copy_out, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
