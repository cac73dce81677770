"""`precompile_model(model)`: compile, before serving (or training), every kernel a model's FP8 layers will load."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from deepgemm.api.gemm import check_num_sms, planning_gpu_name
from deepgemm.api.precompile import (
    DEFAULT_TOKENS,
    Kernel,
    PrecompileSummary,
    Progress,
    compile_sources,
    dense_kernel,
    local_target,
    quantizer_kernel,
    token_counts,
    training_kernels,
    unique_sources,
)
from deepgemm.nn.linear import Fp8Linear
from deepgemm.nn.training import Fp8TrainingGemm


def fp8_layer_shapes(model: nn.Module) -> list[tuple[int, int, torch.dtype]]:
    """The distinct (N, K, output dtype) of `model`'s Fp8Linear layers that run the FP8 kernel (route "fp8"; the
    others multiply a dequantized weight and compile nothing)."""
    shapes = ((m.out_features, m.in_features, m.out_dtype) for m in model.modules()
              if isinstance(m, Fp8Linear) and m.route == "fp8")
    return list(dict.fromkeys(shapes))


def fp8_training_gemms(model: nn.Module) -> list[Fp8TrainingGemm]:
    """The distinct GEMM shapes of `model`'s layers trained through fp8_linear (Fp8TrainingLinear and the
    tensor-parallel training layers: every module with an `fp8_training_gemm()` method)."""
    gemms = (method() for m in model.modules() if callable(method := getattr(m, "fp8_training_gemm", None)))
    return list(dict.fromkeys(gemm for gemm in gemms if isinstance(gemm, Fp8TrainingGemm)))


def precompile_model(model: nn.Module, tokens: Iterable[int] = DEFAULT_TOKENS, *, num_sms: int | None = None,
                     gpu: str | None = None, input_dtype: torch.dtype = torch.bfloat16, workers: int | None = None,
                     progress: Progress | None = None) -> PrecompileSummary:
    """Compile into the disk cache the kernels `model`'s Fp8Linear layers load when called with each of `tokens`
    rows (the inputs flattened to [tokens, in_features]): one FP8 GEMM per (token count, layer shape) and the
    per-token-group quantizer of `input_dtype`, deduplicated. Layers trained in FP8 (Fp8TrainingLinear, the
    tensor-parallel training layers) get a whole training step's kernels: Fprop, Dgrad and Wgrad GEMMs and the
    quantizers of x, W and dy. Another row count may pick another kernel, which then compiles on its first call.

    num_sms / gpu: the SM count and the GPU model (as torch.cuda.get_device_name() names it, e.g. "NVIDIA H200";
    its tuned table picks dense tiles, and a name without one plans with the cost model) to plan for; default this
    GPU's, or 132 SMs and the cost model alone without a GPU (`deepgemm precompile` plans for an H200 there).
    num_sms: an int from 1 to the GPU's SM count (without a GPU: to 132), as fp8_gemm_nt takes. workers:
    parallel compiles (default os.cpu_count()). progress: called after each kernel with a KernelDone.

    Args:
        model: any nn.Module; its Fp8Linear layers (after convert or load_fp8_checkpoint) and FP8 training layers
            (after convert(model, training=True)) are planned.
        tokens: the row counts to plan for (positive ints; default 1, 2, 4, ..., 8192).
        num_sms / gpu: see above.
        input_dtype: the dtype of the layers' inputs, whose quantizer is compiled (default bfloat16); for layers
            trained in FP8 also their outputs' and output gradients' dtype (unless the layer fixes it, as a
            row-parallel shard's float32 partial sums), which picks the Fprop / Dgrad GEMM outputs and dy's
            quantizers: pass the dtype the training step's activations have.
        workers / progress: see above.

    Returns:
        A PrecompileSummary (kernels planned, compiled, already cached, seconds, cache dir).

    Raises:
        ValueError: a token count is not a positive int (or none is given), `num_sms` is out of range, or
            `workers` is not a positive int.
        TypeError: `input_dtype` is not float32, bfloat16 or float16, `num_sms` is not an int, or `gpu` is not a
            str.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError: a kernel could not compile or be
            cached (the first failure cancels the compiles not yet started).

    Example::

        deepgemm.convert(model)
        print(deepgemm.precompile_model(model, tokens=(1, 2, 4, 8, 16, 32, 64, 128, 4096)))
    """
    check_num_sms(num_sms, "precompile_model")
    target = local_target(num_sms, planning_gpu_name(gpu, "precompile_model"))
    quantizer = quantizer_kernel(input_dtype)
    shapes = fp8_layer_shapes(model)
    counts = token_counts(tokens)
    kernels: list[Kernel] = [dense_kernel(m, n, k, out_dtype, target) for m in counts for n, k, out_dtype in shapes]
    if kernels:
        kernels.append(quantizer)
    for gemm in fp8_training_gemms(model):
        out_dtype = input_dtype if gemm.out_dtype is None else gemm.out_dtype
        for m in counts:
            kernels += training_kernels(m, gemm.out_features, gemm.in_features, input_dtype, gemm.weight_dtype,
                                        out_dtype, target)
    return compile_sources(unique_sources(kernels), workers=workers, progress=progress)
