"""Host (CPU) time per warm eager call: deepgemm.fp8_gemm_nt vs torch's block-wise scaled_mm.

A tiny shape keeps the GPU ahead of the CPU, so the loop measures launch-path cost, not kernel time.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.helpers, dev.*

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import deepgemm  # noqa: E402
from tests.helpers import random_operands  # noqa: E402


def per_call_us(fn, calls: int = 3000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


BUSY_CALLS = 400  # stays below the launch queue's depth, so a launch never waits for a free slot
BUSY_SLEEP_CYCLES = 60_000_000  # ~30 ms at the H200's clocks: longer than 400 calls of any path here


def busy_gpu_per_call_us(fn, calls: int = BUSY_CALLS) -> float:
    """Host time per call while the GPU is held busy by a sleep kernel queued first, so the loop can
    never wait for the GPU to retire earlier launches: pure CPU-side cost (Python + driver submission).
    A batch counts only if the GPU was still busy when its last call returned."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(7):
        torch.cuda._sleep(BUSY_SLEEP_CYCLES)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        done = torch.cuda.Event()
        done.record()
        if not done.query():  # the queue had not drained: every call ran against a busy GPU
            best = min(best, elapsed / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main() -> None:
    m, n, k = 16, 512, 512
    a, b = random_operands(m, n, k, "cuda", seed=1)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    ours = per_call_us(lambda: deepgemm.fp8_gemm_nt(a, b, out))
    ours_alloc = per_call_us(lambda: deepgemm.fp8_gemm_nt(a, b))
    sfa_cublas = a[1].t().contiguous().t()
    sfb_t = b[1].t()
    bt = b[0].t()
    cublas = per_call_us(lambda: F.scaled_mm(a[0], bt, sfa_cublas, F.ScalingType.BlockWise1x128, sfb_t,
                                             F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16))
    print(f"host_us fp8_gemm_nt(out=) {ours:.2f} | fp8_gemm_nt(alloc) {ours_alloc:.2f} | torch scaled_mm blockwise {cublas:.2f}")
    busy = [busy_gpu_per_call_us(lambda: deepgemm.fp8_gemm_nt(a, b, out)),
            busy_gpu_per_call_us(lambda: deepgemm.fp8_gemm_nt(a, b)),
            busy_gpu_per_call_us(lambda: F.scaled_mm(a[0], bt, sfa_cublas, F.ScalingType.BlockWise1x128, sfb_t,
                                                     F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16))]
    print("host_us_gpu_busy fp8_gemm_nt(out=) {:.2f} | fp8_gemm_nt(alloc) {:.2f} | torch scaled_mm blockwise {:.2f}"
          .format(*busy))
    breakdown(a, b, out)
    print(f"host_us split-tail plan launch {split_launch_us():.2f}")
    grouped_host_us()
    integration_host_us(a, b, out)
    bf16_host_us()
    softmax_rope_host_us()


def bf16_host_us() -> None:
    """A warm bf16_gemm_nt with `out` and with a new output, against torch.matmul on the same operands."""
    x = torch.randn(16, 512, device="cuda").to(torch.bfloat16)
    w = torch.randn(512, 512, device="cuda").to(torch.bfloat16)
    out = torch.empty(16, 512, dtype=torch.bfloat16, device="cuda")
    calls = [lambda: deepgemm.bf16_gemm_nt(x, w, out), lambda: deepgemm.bf16_gemm_nt(x, w), lambda: x @ w.t()]
    print("host_us_gpu_busy bf16_gemm_nt(out=) {:.2f} | bf16_gemm_nt(alloc) {:.2f} | torch.matmul {:.2f}"
          .format(*(busy_gpu_per_call_us(fn) for fn in calls)))



def softmax_rope_host_us() -> None:
    """Warm deepgemm.softmax (causal) and rope / rope_ at decode sizes, against torch.softmax and a torch eager RoPE
    (six kernels) on the same tensors."""
    x = torch.randn(64, 32, 1, 4096, device="cuda").to(torch.bfloat16)
    q = torch.randn(64, 32, 128, device="cuda").to(torch.bfloat16)
    k = torch.randn(64, 8, 128, device="cuda").to(torch.bfloat16)
    angles = torch.outer(torch.arange(4096.0, device="cuda"), torch.rand(64, device="cuda"))
    cache, positions = torch.cat((angles.cos(), angles.sin()), dim=-1), torch.arange(64, device="cuda")

    def torch_rope(t: torch.Tensor) -> torch.Tensor:
        rows = cache[positions]
        cos, sin = rows[:, None, :64], rows[:, None, 64:]
        x1, x2 = t[..., :64].float(), t[..., 64:].float()
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(t.dtype)

    def torch_rope_qk() -> None:
        torch_rope(q)
        torch_rope(k)

    calls = [lambda: deepgemm.softmax(x, scale=0.088, causal=True), lambda: torch.softmax(x, dim=-1),
             lambda: deepgemm.rope(q, k, cache, positions), lambda: deepgemm.rope_(q, k, cache, positions),
             torch_rope_qk]
    # (torch's eager RoPE, a dozen ops, takes longer than the sleep kernel over 400 calls: time 100)
    print("host_us_gpu_busy softmax(causal) {:.2f} | torch.softmax {:.2f} | rope {:.2f} | rope_ {:.2f} | "
          "torch eager rope {:.2f}".format(*(busy_gpu_per_call_us(fn, 100 if fn is torch_rope_qk else BUSY_CALLS)
                                             for fn in calls)))


def integration_host_us(a, b, out) -> None:
    """Host time of the PyTorch-facing paths: the custom op called directly, and a warm Fp8Linear forward."""
    from deepgemm.nn import Fp8Linear

    op = torch.ops.deepgemm.fp8_gemm_nt
    direct = busy_gpu_per_call_us(lambda: op(a[0], a[1], b[0], b[1]))
    direct_out = busy_gpu_per_call_us(lambda: torch.ops.deepgemm.fp8_gemm_nt_out(a[0], a[1], b[0], b[1], out))
    layer = Fp8Linear.from_linear(torch.nn.Linear(512, 512, dtype=torch.bfloat16, device="cuda"))
    layer.route = "fp8"
    plain = Fp8Linear.from_linear(torch.nn.Linear(512, 512, bias=False, dtype=torch.bfloat16, device="cuda"))
    plain.route = "fp8"
    x = torch.randn(16, 512, dtype=torch.bfloat16, device="cuda")
    w = (plain.weight, plain.weight_scale_inv)
    with torch.inference_mode():
        linear_us = busy_gpu_per_call_us(lambda: layer(x), calls=BUSY_CALLS // 3)  # 3 launches per call
        plain_us = busy_gpu_per_call_us(lambda: plain(x), calls=BUSY_CALLS // 2)
        two_calls_us = busy_gpu_per_call_us(lambda: deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(x), w),
                                            calls=BUSY_CALLS // 2)
    grad_mode = busy_gpu_per_call_us(lambda: deepgemm.fp8_gemm_nt(a, b, out))
    quant = busy_gpu_per_call_us(lambda: deepgemm.quantize_per_token_group(x))
    print(f"host_us_gpu_busy torch.ops.deepgemm.fp8_gemm_nt {direct:.2f} | fp8_gemm_nt_out op {direct_out:.2f} | "
          f"Fp8Linear forward (inference_mode, bias) {linear_us:.2f} | Fp8Linear forward, no bias {plain_us:.2f} | "
          f"quantize_per_token_group + fp8_gemm_nt {two_calls_us:.2f} | public call, grad mode on {grad_mode:.2f} | "
          f"quantize_per_token_group {quant:.2f}")


def grouped_host_us() -> None:
    """Host time per warm eager call of the grouped GEMMs (tiny shapes, GPU held busy)."""
    from tests.helpers import random_activations, random_grouped_weights

    groups, max_m, n, k = 8, 128, 512, 512
    a2d = random_activations(groups * max_m, k, "cuda", 3)
    a = (a2d[0].view(groups, max_m, k), a2d[1].reshape(groups, max_m, -1))  # scales read in place
    a_k_major = (a[0], a[1].contiguous())  # scales copied into the kernel's layout per call
    b = random_grouped_weights(groups, n, k, "cuda", 4)
    masked_m = torch.full((groups,), 64, dtype=torch.int32, device="cuda")
    out = torch.empty(groups, max_m, n, dtype=torch.bfloat16, device="cuda")
    masked = busy_gpu_per_call_us(lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, 64))
    masked_copy = per_call_us(lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a_k_major, b, out, masked_m, 64), calls=500)
    m_indices = torch.arange(groups, dtype=torch.int32, device="cuda").repeat_interleave(max_m)
    flat = (a2d[0], a2d[1])
    out2d = out.view(groups * max_m, n)
    contiguous = busy_gpu_per_call_us(lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(flat, b, out2d, m_indices))
    print(f"host_us_gpu_busy m_grouped masked {masked:.2f} | masked with K-major scales (copied; GPU not held) {masked_copy:.2f} | "
          f"m_grouped contiguous {contiguous:.2f}")
    # Where a grouped call's time goes (dense: `breakdown`): the key, and the remembered plan's launch alone.
    from deepgemm.api import grouped

    for name, form, operands, d, grouping in (("masked", grouped._masked_form(64), a, out, masked_m),
                                             ("contiguous", grouped._CONTIGUOUS_FORM, flat, out2d, m_indices)):
        key = grouped._metadata_key(form, operands[0], operands[1], b[0], b[1], d, grouping)
        entry = grouped._ready.get(key)
        if entry is None:
            print(f"grouped_breakdown_us {name}: the call was not remembered (its fast path did not run)")
            continue
        plan, args = entry
        launch = busy_gpu_per_call_us(lambda: plan.launch_packed(args))
        key_us = per_call_us(lambda: grouped._metadata_key(form, operands[0], operands[1], b[0], b[1], d, grouping))
        print(f"grouped_breakdown_us {name}: key {key_us:.2f} | launch_packed (GPU busy) {launch:.2f} | "
              f"{plan.spec.label()} grid {plan.grid} cluster {plan.spec.config.cluster_size} params {args.nbytes} B")


SPLIT_SHAPE = (128, 512, 1024, 64, 128)  # m, n, k, block_m, block_n: 8 tiles split into 8 K ranges on 132 CTAs


def split_launch_us() -> float:
    """Host time per warm eager launch of a split-tail plan (its workspace and counters come from the
    per-stream scratch: no allocation or memset once warm)."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.common.device import sm_count
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    m, n, k, block_m, block_n = SPLIT_SHAPE
    config = make_config(m, n, k, block_m, block_n, sm_count(0), 2, cluster_m=1, split_tail=True)
    plan = get_plan(0, m, n, k, torch.bfloat16, config=config)
    if plan.split_count() < 2:
        raise SystemExit(f"{SPLIT_SHAPE} does not split on this GPU")
    a, b = random_operands(m, n, k, "cuda", seed=2)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    args = plan.packed_args(a[0], a[1], b[0], b[1], out)
    return per_call_us(lambda: plan.launch_packed(args), calls=500)


def breakdown(a, b, out) -> None:
    """The warm fast path's parts, each timed alone: argument key, lookup, stream query, driver launch
    through cuda-bindings, and the same launch through ctypes straight into libcuda (for comparison)."""
    import ctypes

    from deepgemm.api.gemm import _metadata_key, _ready
    from deepgemm.jit.runtime import current_raw_stream

    key = _metadata_key(a[0], a[1], b[0], b[1], out)
    plan, args = _ready[key]
    stream = current_raw_stream(0)
    config = plan._configs[stream]
    parts = {
        "key": lambda: _metadata_key(a[0], a[1], b[0], b[1], out),
        "lookup": lambda: _ready.get(key),
        "stream": lambda: current_raw_stream(0),
        "launch_packed": lambda: plan.launch_packed(args),
        "cuda-bindings launch": lambda: plan.kernel.launch(config, args.address),
    }

    class LaunchConfig(ctypes.Structure):
        _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                    ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]

    if plan.spec.config.cluster_m == 1:
        libcuda = ctypes.CDLL("libcuda.so.1")
        launch = libcuda.cuLaunchKernelEx
        launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        launch.restype = ctypes.c_int
        raw = LaunchConfig((plan.grid, 1, 1), (plan.block, 1, 1), plan.kernel.dynamic_smem_bytes, stream, None, 0)
        raw_address = ctypes.addressof(raw)
        function = int(plan.kernel.kernel)  # a CUkernel launches as a CUfunction
        if launch(raw_address, function, args.address, None) != 0:
            raise SystemExit("ctypes cuLaunchKernelEx failed")
        parts["ctypes launch"] = lambda: launch(raw_address, function, args.address, None)
        parts.update(driver_launch_parts(libcuda, launch, raw, function, args.address))
    # 500 calls: launches faster than the GPU runs the kernels must not fill the launch queue.
    print(f"breakdown_us ({plan.spec.label()}, params {args.nbytes} B) "
          + " | ".join(f"{name} {per_call_us(fn, calls=500):.2f}" for name, fn in parts.items()))
    print("breakdown_us_gpu_busy " + " | ".join(f"{name} {busy_gpu_per_call_us(fn):.2f}" for name, fn in parts.items()))



# Two empty kernels: three scalar parameters, and ten 128-byte aligned structs (the size of a GEMM's parameter block
# of TMA descriptors), to see what the parameter block's size costs the driver per launch.
EMPTY_KERNELS = r"""
struct alignas(64) Blob { unsigned long long words[16]; };
extern "C" __global__ void small_params(int* p, int n, float x) {}
extern "C" __global__ void large_params(const __grid_constant__ Blob b0, const __grid_constant__ Blob b1,
    const __grid_constant__ Blob b2, const __grid_constant__ Blob b3, const __grid_constant__ Blob b4,
    const __grid_constant__ Blob b5, const __grid_constant__ Blob b6, const __grid_constant__ Blob b7,
    const __grid_constant__ Blob b8, const __grid_constant__ Blob b9, int* p, int n) {}
"""


def driver_launch_parts(libcuda, launch_ex, raw, function: int, args_address: int) -> dict:  # noqa: ANN001
    """Launch variants straight into libcuda (ctypes): our kernel through cuLaunchKernel (no launch attributes)
    instead of cuLaunchKernelEx, and the two empty kernels through cuLaunchKernelEx, one CTA each."""
    import ctypes

    from deepgemm.jit.compiler import KernelSource
    from deepgemm.kernels.common.loader import load_kernel

    launch = libcuda.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    launch.restype = ctypes.c_int
    grid, block = raw.grid[0], raw.block[0]
    parts = {"ctypes cuLaunchKernel": lambda: launch(function, grid, 1, 1, block, 1, 1, raw.smem, raw.stream,
                                                     args_address, None)}
    small_values = (ctypes.c_void_p(0), ctypes.c_int(0), ctypes.c_float(0.0))
    large_values = tuple((ctypes.c_uint64 * 16)() for _ in range(10)) + (ctypes.c_void_p(0), ctypes.c_int(0))
    for entry, values in (("small_params", small_values), ("large_params", large_values)):
        kernel = load_kernel(KernelSource(EMPTY_KERNELS, entry, f"host probe {entry}"), 0)
        pointers = (ctypes.c_void_p * len(values))(*(ctypes.addressof(value) for value in values))
        config = type(raw)((1, 1, 1), (32, 1, 1), 0, raw.stream, None, 0)
        config_address, kernel_function = ctypes.addressof(config), int(kernel.kernel)
        if launch_ex(config_address, kernel_function, ctypes.addressof(pointers), None) != 0:
            raise SystemExit(f"ctypes cuLaunchKernelEx of {entry} failed")
        parts[f"empty kernel, {entry}"] = (lambda c=config_address, f=kernel_function, p=pointers, keep=(values, config):
                                           launch_ex(c, f, ctypes.addressof(p), None))
    return parts


if __name__ == "__main__":
    main()
