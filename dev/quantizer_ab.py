"""Time the FP8 quantizers of other trees' packages (carried under .ab, dev/prepare_ab.sh) against this tree's,
interleaved on the same inputs (CUDA-graph replay, L2 flushed, median of 30), and check that every tree writes the
same bytes. GB/s counts the bytes read and written once.
Usage: python dev/quantizer_ab.py deepgemm_main [more packages]"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / ".ab"))

import torch  # noqa: E402

import deepgemm  # noqa: E402
from deepgemm.tuning.timing import bench_gpu_interleaved  # noqa: E402

BF16, FP32 = torch.bfloat16, torch.float32


def cases() -> list[tuple[str, str, tuple[int, int], torch.dtype, int]]:
    """(label, function, shape, dtype, bytes moved)."""
    out = []
    for m, k, dtype in ((4096, 7168, BF16), (4096, 2048, BF16), (16384, 7168, BF16), (4096, 7168, FP32), (64, 7168, BF16)):
        moved = m * k * (dtype.itemsize + 1) + m * k // 128 * 4
        out.append((f"per token group {dtype} {m}x{k}", "quantize_per_token_group", (m, k), dtype, moved))
    for n, k, dtype in ((7168, 2048, FP32), (7168, 16384, BF16)):
        out.append((f"per block {dtype} {n}x{k}", "quantize_per_block", (n, k), dtype, n * k * (dtype.itemsize + 1)))
        out.append((f"per block + transpose {dtype} {n}x{k}", "quantize_per_block_transposed", (n, k), dtype,
                    n * k * (dtype.itemsize + 2)))
    for t, c in ((4096, 7168), (4096, 2048), (1000, 4096)):
        out.append((f"transposed bf16 {t}x{c}", "quantize_transposed", (t, c), BF16, t * c * 3))
        out.append((f"both ways bf16 {t}x{c}", "quantize_both_ways", (t, c), BF16, t * c * 4))
    return out


def call(tree, name: str, x: torch.Tensor):  # noqa: ANN001 - a package module
    if name in ("quantize_per_token_group", "quantize_per_block"):
        return getattr(tree, name)(x)
    ops = importlib.import_module(f"{tree.__name__}.ops.quant")
    if name == "quantize_per_block_transposed":
        return ops.quantize_per_block_transposed(x)[:3]
    return getattr(ops, name)(x, (x.shape[0] + 127) // 128 * 128)


def same(a, b) -> bool:  # noqa: ANN001 - tuples of tensors
    return all(torch.equal(p.view(torch.uint8) if p.dtype == torch.float8_e4m3fn else p,
                           q.view(torch.uint8) if q.dtype == torch.float8_e4m3fn else q) for p, q in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+")
    names = parser.parse_args().packages
    trees = [deepgemm] + [importlib.import_module(name) for name in names]
    print(f"| case | this µs | this GB/s | {' | '.join(f'{n} µs' for n in names)} | "
          f"{' | '.join(f'{n} / this' for n in names)} | same bytes |")
    print("|---|---|---|" + "---|" * (2 * len(names) + 1))
    for label, name, shape, dtype, moved in cases():
        x = (torch.randn(*shape, device="cuda") * torch.exp(torch.randn(shape[0], 1, device="cuda"))).to(dtype)
        outs = [call(tree, name, x) for tree in trees]
        equal = all(same(outs[0], o) for o in outs[1:])
        times = [t.median_us for t in bench_gpu_interleaved([lambda t=t: call(t, name, x) for t in trees])]
        others = " | ".join(f"{t:.1f}" for t in times[1:])
        ratios = " | ".join(f"{t / times[0]:.3f}" for t in times[1:])
        print(f"| {label} | {times[0]:.1f} | {moved / times[0] / 1e3:.0f} | {others} | {ratios} | {equal} |", flush=True)


if __name__ == "__main__":
    main()
