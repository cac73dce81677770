"""BF16 GEMM in four layouts against cuBLAS (torch.matmul on the same stored operands) and DeepGEMM HEAD
(deep_gemm.bf16_gemm_<layout>, where importable), interleaved sample by sample, CUDA-graph replay, L2 flushed,
median of 30, on the DeepSeek-V3 shapes. Prints one markdown table per layout (us, TFLOPS or GB/s, ratios) and the
geometric means; then the warm host time of one call. Usage: dev/bench_bf16.py [layout ...] [--m 64,128,4096]"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import deepgemm  # noqa: E402
from deepgemm.bench import deepseek  # noqa: E402
from deepgemm.tuning.timing import bench_gpu_interleaved  # noqa: E402

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
CUBLAS = {"nt": lambda a, b: a @ b.t(), "nn": lambda a, b: a @ b, "tn": lambda a, b: a.t() @ b, "tt": lambda a, b: a.t() @ b.t()}


def operands(layout: str, m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda").to(torch.bfloat16)
    b = torch.randn((n, k) if layout[1] == "t" else (k, n), device="cuda").to(torch.bfloat16)
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("layouts", nargs="*", default=["nt", "nn", "tn", "tt"])
    parser.add_argument("--m", default="64,128,4096")
    args = parser.parse_args()
    ms = [int(x) for x in args.m.split(",")]
    dg = None if deepseek.missing() else deepseek.load()
    print(f"DeepGEMM: {deepseek.version() if dg else deepseek.missing()}")
    torch.manual_seed(0)
    for layout in args.layouts:
        ours_fn = getattr(deepgemm, f"bf16_gemm_{layout}")
        print(f"\n### bf16_gemm_{layout}\n")
        print("| shape | ours us | ours | cuBLAS us | DeepGEMM us | vs cuBLAS | vs DeepGEMM | vs best | config |")
        print("|---|---|---|---|---|---|---|---|---|")
        ratios_best: list[float] = []
        for m in ms:
            for n, k in NK:
                a, b = operands(layout, m, n, k)
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                ref = CUBLAS[layout](a, b)
                fns = [lambda: ours_fn(a, b, out), lambda: CUBLAS[layout](a, b)]
                dg_out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                dg_ok = False
                if dg is not None:
                    try:
                        getattr(dg, f"bf16_gemm_{layout}")(a, b, dg_out)
                        torch.cuda.synchronize()
                        dg_ok = deepgemm.calc_diff(dg_out.float(), ref.float()) < 1e-3
                        if dg_ok:
                            fns.append(lambda: getattr(dg, f"bf16_gemm_{layout}")(a, b, dg_out))
                        else:
                            print(f"<!-- DeepGEMM {layout} {m}x{n}x{k}: wrong result -->")
                    except Exception as exc:  # noqa: BLE001 - a peer that cannot run a shape is reported, not fatal
                        print(f"<!-- DeepGEMM {layout} {m}x{n}x{k}: {type(exc).__name__}: {str(exc)[:120]} -->")
                ours_fn(a, b, out)
                torch.cuda.synchronize()
                diff = deepgemm.calc_diff(out.float(), ref.float())
                timings = bench_gpu_interleaved(fns, iters=30)
                t = [x.median_us for x in timings]
                flops = 2 * m * n * k
                byts = (m * k + n * k + m * n) * 2
                rate = (f"{flops / t[0] / 1e6:.0f} TFLOPS" if m > 128 else f"{byts / t[0] / 1e3:.0f} GB/s")
                dg_t = t[2] if len(t) > 2 else None
                best = min(t[1], dg_t) if dg_t else t[1]
                ratios_best.append(best / t[0])
                from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_spec
                cfg = bf16_spec(m, n, k, layout, torch.bfloat16, None, torch.cuda.get_device_properties(0).multi_processor_count).config
                print(f"| {m}x{n}x{k} | {t[0]:.1f} | {rate} | {t[1]:.1f} | {f'{dg_t:.1f}' if dg_t else 'n/a'} | "
                      f"{t[1] / t[0]:.2f} | {f'{dg_t / t[0]:.2f}' if dg_t else 'n/a'} | {best / t[0]:.2f} | "
                      f"{cfg.label()}{'' if diff < 1e-4 else f' DIFF {diff:.1e}'} |")
        geo = math.exp(sum(math.log(r) for r in ratios_best) / len(ratios_best))
        print(f"\ngeometric mean vs the best peer ({layout}): {geo:.3f}; behind on {sum(r < 1 for r in ratios_best)} of {len(ratios_best)}")
    a, b = operands("nt", 8, 256, 256)  # a few-us kernel: 300 launches never fill the launch queue
    out = torch.empty(8, 256, device="cuda", dtype=torch.bfloat16)
    for _ in range(100):
        deepgemm.bf16_gemm_nt(a, b, out)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(300):
        deepgemm.bf16_gemm_nt(a, b, out)
    host = (time.perf_counter() - start) / 300 * 1e6
    torch.cuda.synchronize()
    print(f"\nhost time per warm bf16_gemm_nt(a, b, out) call: {host:.1f} us")


if __name__ == "__main__":
    main()
