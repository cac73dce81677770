"""``deepgemm precompile``: compile, before serving, every kernel a model's FP8 inference steps use (no GPU needed).

Covered, on one tensor-parallel rank, for each token count T of ``--tokens`` (the M buckets; default 1, 2, 4, ...,
8192):

- every FP8 linear layer (attention projections, dense MLP, shared experts; QKV and gate/up fused) as a dense GEMM
  of M = T rows: a prefill chunk of T tokens, or a decode step of T sequences (same layers, same rows);
- every MoE expert GEMM in both layouts an engine runs: contiguous (prefill) with M_total = T * top-k rows routed
  evenly, each expert's segment padded to 128 rows, and masked (decode) with expected_m = (T * top-k + E) // E
  and max_m = T rounded up to 64, over all E experts of the rank;
- the per-token-group quantizer of bf16 activations, and for a SiLU-gated MoE model the fused activation +
  quantizer of its experts' down projection input (silu_mul_quantize_per_token_group).

The router and LM head (bf16), attention's batched products and GEMMs with K % 16 != 0 are not deepgemm FP8 GEMMs
and are skipped. A row count between the buckets (or a routing other than even) may pick another kernel, which
then compiles on its first call.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import torch

from deepgemm.analysis.gemms import MOE_EXPERTS, Workload, enumerate_gemms
from deepgemm.analysis.gpus import DEFAULT_GPU, GPUS, get_gpu
from deepgemm.analysis.models import ModelConfigError, ModelSpec
from deepgemm.analysis.ops import GemmOp
from deepgemm.analysis.presets import PRESETS, resolve_model
from deepgemm.api.precompile import (
    DEFAULT_TOKENS,
    Kernel,
    KernelDone,
    Target,
    compile_sources,
    dense_kernel,
    local_target,
    moe_kernels,
    quantizer_kernel,
    token_counts,
    unique_sources,
)
from deepgemm.bench.console import usage_error
from deepgemm.commands.arguments import check_num_sms, local_sm_limit, positive_int
from deepgemm.errors import DeepGemmError
from deepgemm.jit.compiler import KernelSource

# The GPUs kernels can be planned for: the Hopper parts (their device names key the tuned tables, deepgemm.tuning.db).
HOPPER_GPUS = tuple(key for key, spec in GPUS.items() if spec.runs_sm90a and spec.device_name is not None)
OUT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "precompile", help="compile every kernel a model's FP8 inference steps use (no GPU needed)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="NAME|config.json",
                        help=f"a preset ({', '.join(PRESETS)}) or a local Hugging Face config.json / model folder")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks; kernels are planned for one rank")
    parser.add_argument("--tokens", type=parse_tokens, default=DEFAULT_TOKENS, metavar="T1,T2,...",
                        help="token counts (M buckets) to plan for (default 1,2,4,...,8192)")
    parser.add_argument("--gpu", help=f"GPU to plan for, its SM count and tuned table ({', '.join(HOPPER_GPUS)});"
                                      f" default: the local GPU, else {DEFAULT_GPU}")
    parser.add_argument("--num-sms", type=positive_int, metavar="N",
                        help="SMs to plan for, 1 to the GPU's count (default: the GPU's; locally DEEPGEMM_NUM_SMS caps "
                             "it, as at run time)")
    parser.add_argument("--workers", type=positive_int, metavar="N",
                        help=f"parallel compiles (default: the CPU count, {os.cpu_count()})")
    parser.add_argument("--out-dtype", choices=tuple(OUT_DTYPES), default="bf16", help="GEMM output dtype (bf16)")
    parser.set_defaults(func=run)


def parse_tokens(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); argparse reports anything but a list of positive integers."""
    try:
        return token_counts(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--tokens must be a comma-separated list of positive integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    try:
        model = resolve_model(args.model)
        target = planning_target(args.gpu, args.num_sms)
        sources = plan_model(model, args.tp, args.tokens, OUT_DTYPES[args.out_dtype], target)
    except ModelConfigError as exc:
        return usage_error("precompile", f"argument --model: {exc}")
    except ValueError as exc:
        return usage_error("precompile", str(exc))
    tokens = args.tokens
    print(f"{model.name}, tp {args.tp}: {len(sources)} kernels for {len(tokens)} token counts "
          f"({tokens[0]}..{tokens[-1]}), {target.num_sms} SMs, tuned table of {target.gpu_name}",
          file=sys.stderr, flush=True)
    try:
        summary = compile_sources(sources, workers=args.workers, progress=_print_progress)
    except DeepGemmError as exc:  # a compile failure, a cache failure (CacheError), a lock timeout
        print(f"deepgemm precompile: error: {exc}", file=sys.stderr)
        return 1
    print(summary)
    return 0


def planning_target(gpu: str | None, num_sms: int | None) -> Target:
    """--gpu's SM count and tuned table; without it the local GPU's, else DEFAULT_GPU's; --num-sms overrides, from 1
    to that GPU's SM count."""
    if gpu is None and torch.cuda.is_available():
        check_num_sms(num_sms, *local_sm_limit())
        return local_target(num_sms)
    try:
        spec = get_gpu(gpu or DEFAULT_GPU)
    except ValueError as exc:
        raise ValueError(f"argument --gpu: {exc}") from None
    name = spec.device_name
    if not spec.runs_sm90a or name is None:
        raise ValueError(f"argument --gpu: {spec.name} is not a Hopper GPU ({spec.arch}; deepgemm's kernels are "
                         "sm_90a, which run on Hopper only)")
    check_num_sms(num_sms, spec.num_sms, spec.name)
    if gpu is None:
        return local_target(num_sms, name)  # no GPU: 132 SMs (an H200's) under DEEPGEMM_NUM_SMS, as at run time
    return Target(spec.num_sms if num_sms is None else num_sms, name)


def plan_model(model: ModelSpec, tp: int, tokens: tuple[int, ...], out_dtype: torch.dtype,
               target: Target) -> list[KernelSource]:
    """The distinct kernels of the module docstring's list, in order of first use."""
    kernels: list[Kernel] = []
    for count in token_counts(tokens):
        for op in enumerate_gemms(model, Workload(batch=1, seq=count, tp=tp)):
            kernels.extend(_op_kernels(model, op, count, out_dtype, target))
    kernels.append(quantizer_kernel(torch.bfloat16))
    if model.moe is not None and model.silu_gated:
        kernels.append(quantizer_kernel(torch.bfloat16, silu_mul=True))
    return unique_sources(kernels)


def _op_kernels(model: ModelSpec, op: GemmOp, tokens: int, out_dtype: torch.dtype,
                target: Target) -> Sequence[Kernel]:
    """The kernels of one GEMM of a prefill step of `tokens` tokens (none for bf16 ones: router, LM head, attention
    products; or for K % 16 != 0, which the kernel cannot take)."""
    if op.precision != "fp8" or op.k % 16:
        return []
    if op.category == MOE_EXPERTS and model.moe is not None:
        moe = model.moe
        return moe_kernels(tokens, moe.experts_per_token, moe.num_experts, op.n, op.k, out_dtype, target)
    return [dense_kernel(op.m, op.n, op.k, out_dtype, target)]


def _print_progress(event: KernelDone) -> None:
    """One line per finished kernel: "cached" when it came from the cache, else how long compiling it took."""
    what = "cached          " if event.cached else f"compiled {event.seconds:5.1f} s"
    print(f"[{event.done}/{event.total}] {what}  {event.label}", file=sys.stderr, flush=True)
