"""deepgemm.softmax and deepgemm.rope / rope_ against torch eager and torch.compile (inductor) on the same inputs,
interleaved (CUDA-graph replay, L2 flushed, median of 30), with each output's error against float64.

GB/s counts what the op must move: softmax reads x and writes y; RoPE reads and writes q and k (all features
for the functional form) and reads the tokens' cache rows and positions. "copy" is a device copy of the same bytes
(x into a buffer; q and k into buffers), timed in the same rounds: the floor on this GPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import deepgemm  # noqa: E402
from deepgemm.reference import causal_keep, rope_reference  # noqa: E402
from deepgemm.tuning.timing import bench_gpu_interleaved  # noqa: E402

BF16, FP32 = torch.bfloat16, torch.float32

# (label, leading shape, sq, n, dtype, scale, causal)
SOFTMAX = [
    ("attention prefill 32 heads, 1024 x 1024", (32,), 1024, 1024, BF16, 0.088, True),
    ("attention prefill 32 heads, 4096 x 4096", (32,), 4096, 4096, BF16, 0.088, True),
    ("attention 32 heads, 2048 x 2048, no mask", (32,), 2048, 2048, BF16, 0.088, False),
    ("decode 64 seqs x 32 heads, 1 x 8192", (2048,), 1, 8192, BF16, 0.088, True),
    ("MoE router 16384 tokens x 256 experts", (), 16384, 256, FP32, 1.0, False),
    ("MoE router 16384 tokens x 64 experts", (), 16384, 64, FP32, 1.0, False),
    ("vocab 512 x 32000", (), 512, 32000, BF16, 1.0, False),
    ("vocab 64 x 128256 (8-CTA clusters)", (), 64, 128256, FP32, 1.0, False),
    ("vocab 16 x 262144 bf16 (8-CTA clusters)", (), 16, 262144, BF16, 1.0, False),
    ("vocab 8 x 1048576 (streaming)", (), 8, 1048576, FP32, 1.0, False),
    ("65536 x 100 (unaligned: scalar path)", (), 65536, 100, FP32, 1.0, False),
]

# (label, tokens, q heads, k heads, head_dim, rotary_dim, interleaved, dtype)
ROPE = [
    ("Llama-3 8B prefill", 4096, 32, 8, 128, 128, False, BF16),
    ("Llama-3 8B decode batch 64", 64, 32, 8, 128, 128, False, BF16),
    ("Llama-3 70B prefill 16k", 16384, 64, 8, 128, 128, False, BF16),
    ("DeepSeek-V3 MLA rope dims", 4096, 128, 1, 64, 64, True, BF16),
    ("partial rotary (R = 32 of 128)", 4096, 32, 32, 128, 32, False, BF16),
    ("float32 Qwen-7B prefill", 4096, 28, 4, 128, 128, False, FP32),
]


def torch_softmax(x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    s = x.float() * scale
    if causal:
        s = s.masked_fill(~causal_keep(x.shape[-2], x.shape[-1], x.device), float("-inf"))
    return torch.softmax(s, dim=-1).to(x.dtype)


def torch_rope(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, interleaved: bool) -> torch.Tensor:
    rotary = cache.shape[1]
    half = rotary // 2
    rows = cache[positions]
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    r = x[..., :rotary].float()
    x1, x2 = (r[..., 0::2], r[..., 1::2]) if interleaved else (r[..., :half], r[..., half:])
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotated = torch.stack((o1, o2), dim=-1).flatten(-2) if interleaved else torch.cat((o1, o2), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rotary:]), dim=-1)


def softmax_f64(x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    s = x.double() * scale
    if causal:
        s = s.masked_fill(~causal_keep(x.shape[-2], x.shape[-1], x.device), float("-inf"))
    return torch.softmax(s, dim=-1)


def error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.double() - ref).abs().max().item()


def bench_softmax(compiled: bool) -> None:
    inductor = torch.compile(torch_softmax, dynamic=True) if compiled else None
    print("| case | dtype | deepgemm µs | GB/s | copy µs (copy / ours) | torch eager µs | torch.compile µs | "
          "eager / ours | compile / ours | max error vs float64 (ours, eager) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, lead, sq, n, dtype, scale, causal in SOFTMAX:
        x = (torch.randn(*lead, sq, n, device="cuda") * 3).to(dtype)
        ref = softmax_f64(x, scale, causal)
        ours_out, eager_out = deepgemm.softmax(x, scale=scale, causal=causal), torch_softmax(x, scale, causal)
        buffer = torch.empty_like(x)
        fns = [lambda: deepgemm.softmax(x, scale=scale, causal=causal), lambda: buffer.copy_(x),
               lambda: torch_softmax(x, scale, causal)]
        if inductor is not None:
            fns.append(lambda: inductor(x, scale, causal))
        times = bench_gpu_interleaved(fns, iters=30)
        ours, copy, eager = (t.median_us for t in times[:3])
        comp = times[3].median_us if len(times) > 3 else float("nan")
        gbs = 2 * x.numel() * x.element_size() / ours / 1e3
        print(f"| {label} | {str(dtype)[6:]} | {ours:.1f} | {gbs:.0f} | {copy:.1f} ({copy / ours:.2f}) | {eager:.1f} | "
              f"{comp:.1f} | {eager / ours:.2f} | {comp / ours:.2f} | {error(ours_out, ref):.1e}, "
              f"{error(eager_out, ref):.1e} |")
        sys.stdout.flush()
        del x, ref, ours_out, eager_out, buffer
        torch.cuda.empty_cache()


def bench_rope(compiled: bool) -> None:
    inductor = torch.compile(torch_rope, dynamic=True) if compiled else None
    print("| case | T x Hq / Hk x D (R) | rope µs | GB/s | copy µs (copy / rope) | rope_ (in place) µs | torch eager µs | "
          "torch.compile µs | eager / rope | compile / rope | max error vs float64 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, tokens, hq, hk, dim, rotary, interleaved, dtype in ROPE:
        q = torch.randn(tokens, hq, dim, device="cuda").to(dtype)
        k = torch.randn(tokens, hk, dim, device="cuda").to(dtype)
        inv = 1.0 / 10000 ** (torch.arange(0, rotary, 2, device="cuda", dtype=torch.float64) / rotary)
        angles = torch.outer(torch.arange(32768, device="cuda", dtype=torch.float64), inv)
        cache = torch.cat((angles.cos(), angles.sin()), dim=-1).float()
        positions = torch.randint(0, 32768, (tokens,), device="cuda")
        q2, k2 = q.clone(), k.clone()
        q_out, _ = deepgemm.rope(q, k, cache, positions, interleaved=interleaved)
        ref = rope_reference(q.double(), cache.double(), positions, interleaved, compute_dtype=torch.float64)
        q_buffer, k_buffer = torch.empty_like(q), torch.empty_like(k)
        fns = [lambda: deepgemm.rope(q, k, cache, positions, interleaved=interleaved),
               lambda: (q_buffer.copy_(q), k_buffer.copy_(k)),
               lambda: deepgemm.rope_(q2, k2, cache, positions, interleaved=interleaved),
               lambda: (torch_rope(q, cache, positions, interleaved), torch_rope(k, cache, positions, interleaved))]
        if inductor is not None:
            fns.append(lambda: (inductor(q, cache, positions, interleaved), inductor(k, cache, positions, interleaved)))
        times = bench_gpu_interleaved(fns, iters=30)
        ours, copy, in_place, eager = (t.median_us for t in times[:4])
        comp = times[4].median_us if len(times) > 4 else float("nan")
        moved = 2 * (q.numel() + k.numel()) * q.element_size() + tokens * (rotary * 4 + 8)
        gbs = moved / ours / 1e3
        shape = f"{tokens} x {hq} / {hk} x {dim} ({rotary}{', interleaved' if interleaved else ''})"
        print(f"| {label} | {shape} | {ours:.1f} | {gbs:.0f} | {copy:.1f} ({copy / ours:.2f}) | {in_place:.1f} | "
              f"{eager:.1f} | {comp:.1f} | {eager / ours:.2f} | {comp / ours:.2f} | {error(q_out, ref):.1e} |")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--only", choices=("softmax", "rope"))
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.only != "rope":
        bench_softmax(not args.no_compile)
    if args.only != "softmax":
        bench_rope(not args.no_compile)


if __name__ == "__main__":
    main()
