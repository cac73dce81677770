"""FP8 training linear (deepgemm.fp8_linear: forward + dx + dW) against BF16 training on cuBLAS (F.linear) and on our
BF16 kernels (bf16_gemm_nt, differentiable), interleaved on the same inputs (CUDA-graph replay of one whole step,
L2 flushed, median of 30). Then the step's pieces one by one for one shape, and the transposed quantizer against a
transposed copy + the row quantizer and against a plain copy of the same bytes, and the both-ways quantizer (rows
and transposed from one read) against the two run separately.

TFLOPS count the step's three GEMMs (6·T·N·K). The error columns are calc_diff of y, dx, dW against float64 of the
unquantized layer (FP8 training's own error, ~1e-3)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import deepgemm  # noqa: E402
from deepgemm.ops.quant import (  # noqa: E402
    quantize_both_ways,
    quantize_per_block_transposed,
    quantize_transposed,
)
from deepgemm.tuning.timing import bench_gpu_interleaved  # noqa: E402
from deepgemm.utils import align_up  # noqa: E402

BF16, FP32 = torch.bfloat16, torch.float32

# (label, T, N = out_features, K = in_features)
SHAPES = [
    ("DeepSeek-V3 q_a/kv_a 2112x7168", 4096, 2112, 7168),
    ("DeepSeek-V3 q_b 24576x1536", 4096, 24576, 1536),
    ("DeepSeek-V3 o_proj 7168x16384", 4096, 7168, 16384),
    ("DeepSeek-V3 dense up 4096x7168", 4096, 4096, 7168),
    ("DeepSeek-V3 dense down 7168x2048", 4096, 7168, 2048),
    ("Llama-3 8B gate_up 28672x4096", 8192, 28672, 4096),
    ("Llama-3 8B down 4096x14336", 8192, 4096, 14336),
    ("odd tokens 1000, 4096x4096", 1000, 4096, 4096),
]


def grads(fn, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor):
    y = fn(x, w)
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    return y, gx, gw


def _errors(outs, ref) -> str:
    return " / ".join(f"{deepgemm.calc_diff(o.detach().double(), r):.1e}" for o, r in zip(outs, ref))


def bench_steps(iters: int) -> None:
    print("| layer | T×N×K | FP8 step µs | TFLOPS | cuBLAS BF16 µs | ours BF16 µs | cuBLAS / FP8 | "
          "ours BF16 / FP8 | FP8 error y / dx / dW | BF16 error y / dx / dW |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, t, n, k in SHAPES:
        x = (torch.randn(t, k, device="cuda") * torch.exp(torch.randn(t, 1, device="cuda"))).to(BF16).requires_grad_()
        w32 = (torch.randn(n, k, device="cuda") * k**-0.5).requires_grad_()  # FP32 master weight
        w16 = w32.detach().to(BF16).requires_grad_()
        dy = torch.randn(t, n, device="cuda").to(BF16)
        fp8 = lambda: grads(deepgemm.fp8_linear, x, w32, dy)  # noqa: E731
        cublas = lambda: grads(F.linear, x, w16, dy)  # noqa: E731
        ours16 = lambda: grads(lambda a, b: deepgemm.bf16_gemm_nt(a, b), x, w16, dy)  # noqa: E731
        x64, w64, dy64 = x.detach().double(), w32.detach().double(), dy.double()
        ref = (x64 @ w64.t(), dy64 @ w64, dy64.t() @ x64)
        e8, e16 = _errors(fp8(), ref), _errors(cublas(), ref)
        times = bench_gpu_interleaved([fp8, cublas, ours16], iters=iters)
        a, b, c = (tm.median_us for tm in times)
        tflops = 6 * t * n * k / a / 1e6
        print(f"| {label} | {t}×{n}×{k} | {a:.1f} | {tflops:.0f} | {b:.1f} | {c:.1f} | {b / a:.2f} | {c / a:.2f} | "
              f"{e8} | {e16} |")
        sys.stdout.flush()
        del x, w32, w16, dy, x64, w64, dy64, ref
        torch.cuda.empty_cache()


def bench_pieces(iters: int, t: int, n: int, k: int) -> None:
    """Each kernel of one FP8 step (both gradients), timed alone (so the sum exceeds the step: no overlap of
    launches)."""
    x = torch.randn(t, k, device="cuda").to(BF16)
    w = torch.randn(n, k, device="cuda")
    dy = torch.randn(t, n, device="cuda").to(BF16)
    tokens = align_up(t, 128)
    xq, xsf, xqt, xsft = quantize_both_ways(x, tokens)
    wq, wsf, wqt, wsft = quantize_per_block_transposed(w)
    dyq, dysf, dyqt, dysft = quantize_both_ways(dy, tokens)
    wt = (wqt, wsft)
    out = torch.empty(1, n, k, device="cuda")
    pieces = [
        ("quantize x both ways (Fprop + Wgrad operands)", lambda: quantize_both_ways(x, tokens)),
        ("quantize W per block + W^T", lambda: quantize_per_block_transposed(w)),
        ("Fprop GEMM", lambda: deepgemm.fp8_gemm_nt((xq, xsf), (wq, wsf))),
        ("quantize dy both ways (Dgrad + Wgrad operands)", lambda: quantize_both_ways(dy, tokens)),
        ("Dgrad GEMM", lambda: deepgemm.fp8_gemm_nt((dyq, dysf), wt)),
        ("Wgrad GEMM (1D1D)", lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous((dyqt, dysft), (xqt, xsft), out,
                                                                                [tokens])),
        ("for scale: x 1x128 only", lambda: deepgemm.quantize_per_token_group(x)),
        ("for scale: W per block only", lambda: deepgemm.quantize_per_block(w)),
        ("for scale: dy 1x128 only", lambda: deepgemm.quantize_per_token_group(dy)),
        ("for scale: dy transposed only", lambda: quantize_transposed(dy, tokens)),
    ]
    times = bench_gpu_interleaved([fn for _, fn in pieces], iters=iters)
    print(f"\nPieces of one step at T×N×K = {t}×{n}×{k} (each alone):\n")
    print("| piece | µs |")
    print("|---|---|")
    for (name, _), tm in zip(pieces, times):
        print(f"| {name} | {tm.median_us:.1f} |")
    print(f"| sum of the first six | {sum(tm.median_us for tm in times[:6]):.1f} |")


def bench_transposed(iters: int) -> None:
    print("\nTransposed quantizer (x [T, C] bf16 -> x^T e4m3 per 1x128 along T): ours against x.t().contiguous() + "
          "the row quantizer, and against a device copy of x (same bytes read, bf16 written):\n")
    print("| T×C | ours µs | GB/s | copy + quantize µs | copy µs | (copy + quantize) / ours | copy / ours | "
          "both ways µs | GB/s | rows + transposed separately µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t, c in ((4096, 7168), (4096, 2112), (8192, 4096), (16384, 7168), (1000, 4096)):
        x = torch.randn(t, c, device="cuda").to(BF16)
        buffer = torch.empty_like(x)
        tokens = align_up(t, 128)
        fns = [lambda: quantize_transposed(x, tokens),
               lambda: deepgemm.quantize_per_token_group(x.t().contiguous()),
               lambda: buffer.copy_(x),
               lambda: quantize_both_ways(x, tokens),
               lambda: (deepgemm.quantize_per_token_group(x), quantize_transposed(x, tokens))]
        a, b, c_, d, e = (tm.median_us for tm in bench_gpu_interleaved(fns, iters=iters))
        moved = t * c * 2 + c * tokens + c * (tokens // 128) * 4
        both = moved + t * c + t * (c // 128) * 4
        print(f"| {t}×{c} | {a:.1f} | {moved / a / 1e3:.0f} | {b:.1f} | {c_:.1f} | {b / a:.2f} | {c_ / a:.2f} | "
              f"{d:.1f} | {both / d / 1e3:.0f} | {e:.1f} |")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--only", choices=("steps", "pieces", "transposed"))
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.only in (None, "transposed"):
        bench_transposed(args.iters)
    if args.only in (None, "pieces"):
        bench_pieces(args.iters, 4096, 7168, 2048)
    if args.only in (None, "steps"):
        print()
        bench_steps(args.iters)


if __name__ == "__main__":
    main()
