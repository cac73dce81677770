"""Run a few FP8 GEMM, quantization, softmax and RoPE shapes; meant to be run under `compute-sanitizer --tool memcheck`."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.helpers, dev.*

import torch  # noqa: E402

import deepgemm  # noqa: E402
from tests.helpers import random_operands, reference_fp64  # noqa: E402

SHAPES = [(1, 8, 128), (7, 136, 144), (65, 2056, 7296), (129, 7168, 128), (300, 24, 7168)]
# Forced tiles the shapes above do not reach: (m, n, k, block_m, block_n, sms, tail mode, chunked_store); the
# split cases have a small last wave on `sms` CTAs and the stream cases a large one, so their tails go through
# the FP32 workspace; block_m 256
# stores from per-wave buffers (M = 300: a tile whose second wave has no rows) or in chunks; straddling tiles
# with compile-time switch columns (block_n 192, 96).
TILES = [
    (700, 1000, 2048, 192, 128, 30, "split", None),
    (300, 2112, 7296, 256, 128, 30, "split", None),
    (300, 2112, 7296, 256, 128, 20, "stream", None),
    (1000, 2056, 4224, 128, 104, 60, "stream", None),
    (4097, 136, 256, 192, 64, 132, "whole", None),
    (300, 2112, 2048, 256, 128, 16, "whole", None),
    (1300, 2048, 2048, 256, 128, 16, "whole", True),
    (129, 2112, 7168, 128, 192, 132, "whole", None),
    (65, 4032, 1536, 64, 96, 132, "whole", None),
    (1, 2112, 7168, 64, 32, 132, "split", None),  # split-K at decode sizes (the cost model's N = 2112 picks)
    (128, 2112, 7168, 64, 64, 132, "split", None),
    (100, 2112, 7168, 64, 64, 132, "split", None),  # a 36-row last M-block in its own A box, split along K
    (300, 2048, 7296, 128, 128, 132, "a-multicast", None),  # 2-CTA clusters sharing A (cluster_n = 2)
    (1000, 4000, 2048, 256, 128, 16, "a-multicast", None),
]


def main() -> None:
    for m, n, k in SHAPES:
        a, b = random_operands(m, n, k, "cuda", seed=m * 7 + n)
        for dtype in (torch.bfloat16, torch.float32):
            out = deepgemm.fp8_gemm_nt(a, b, out_dtype=dtype)
            torch.cuda.synchronize()
            diff = deepgemm.calc_diff(out.double(), reference_fp64(a, b))
            print(f"sanitize m={m} n={n} k={k} {dtype}: calc_diff={diff:.2e}")
            assert diff < 1e-3
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    for m, n, k, block_m, block_n, sms, tail, chunked in TILES:
        a, b = random_operands(m, n, k, "cuda", seed=m + n + k)
        config = make_config(m, n, k, block_m, block_n, sms, split_tail=tail == "split", stream_tail=tail == "stream",
                             chunked_store=chunked)
        if tail == "a-multicast":
            config = dataclasses.replace(config, cluster_n=2)
        plan = get_plan(0, m, n, k, torch.bfloat16, config=config)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        plan.launch(a[0], a[1], b[0], b[1], out)
        torch.cuda.synchronize()
        diff = deepgemm.calc_diff(out.double(), reference_fp64(a, b))
        splits = plan.split_count()
        print(f"sanitize m={m} n={n} k={k} {plan.spec.label()} splits={splits}: calc_diff={diff:.2e}")
        assert diff < 1e-3 and (splits > 1) == (tail in ("split", "stream"))
    captured_split()
    contiguous()
    masked()
    bf16()
    bf16_grouped()
    quantizers()
    softmax_and_rope()
    fp8_training()


def quantizers() -> None:
    """The per-token-group quantizers (plain and SiLU-gated) on both paths, tails included, and Fp8Linear's
    launch-ready quantize + GEMM from its scratch block."""
    from deepgemm.api.linear import fp8_linear

    for rows, width in ((1, 256), (33, 2 * 1001), (130, 2 * 768), (7, 2 * 72)):
        base = torch.randn(rows, width + 8, device="cuda").to(torch.bfloat16)
        for x in (base[:, :width], base[:, 8:]):  # two row offsets; odd halves (1001) take the scalar path
            q, sf = deepgemm.silu_mul_quantize_per_token_group(x)
            q2, sf2 = deepgemm.quantize_per_token_group(x)
            torch.cuda.synchronize()
            assert torch.isfinite(sf).all() and torch.isfinite(sf2).all()
        print(f"sanitize quantizers rows={rows} width={width}: ok")
    w, s = deepgemm.quantize_per_block(torch.randn(2056, 7296, device="cuda"))
    for m in (1, 65, 129):
        x = torch.randn(m, 7296, device="cuda").to(torch.bfloat16)
        ys = [fp8_linear(x, w, s) for _ in range(3)]
        torch.cuda.synchronize()
        ref = deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(x), (w, s))
        assert all(torch.equal(y, ref) for y in ys)
        print(f"sanitize fp8_linear m={m} n=2056 k=7296: equal to the two calls")


def captured_split() -> None:
    """A split-K decode GEMM (the cost model's pick for 64 x 2112 x 7168) warmed eagerly, then captured in a CUDA
    graph (counters from the capture arena) and replayed on new inputs."""
    m, n, k = 64, 2112, 7168
    a, b = random_operands(m, n, k, "cuda", seed=11)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.fp8_gemm_nt(a, b, out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deepgemm.fp8_gemm_nt(a, b, out)
    for seed in (12, 13):
        fresh, _ = random_operands(m, n, k, "cuda", seed=seed)
        a[0].copy_(fresh[0])
        a[1].copy_(fresh[1])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        diff = deepgemm.calc_diff(out.double(), reference_fp64(a, b))
        print(f"sanitize captured split m={m} n={n} k={k} replay seed={seed}: calc_diff={diff:.2e}")
        assert diff < 1e-3


def masked() -> None:
    """Masked decode groups: A loaded in 16-row (block_m 64) or 64-row (block_m 128) boxes, only as many
    as each group's rows need; an empty group and a full one."""
    from deepgemm.reference import m_grouped_masked_reference

    for expected, counts, n in ((16, [0, 5, 16, 21, 128, 1], 1024), (64, [45, 64, 65, 83, 0, 128, 30, 100], 4096)):
        groups, max_m, k = len(counts), 128, 2048
        a2d, _ = random_operands(groups * max_m, 8, k, "cuda", seed=expected)
        a = (a2d[0].view(groups, max_m, k), a2d[1].reshape(groups, max_m, -1))
        bs = [random_operands(8, n, k, "cuda", seed=100 + g)[1] for g in range(groups)]
        b = (torch.stack([x[0] for x in bs]), torch.stack([x[1] for x in bs]))
        masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
        out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected)
        torch.cuda.synchronize()
        ref = m_grouped_masked_reference(a[0], a[1], b[0], b[1], masked_m, compute_dtype=torch.float64)
        for g, count in enumerate(counts):
            diff = deepgemm.calc_diff(out[g, :count].double(), ref[g, :count]) if count else 0.0
            assert diff < 1e-3 and out[g, -(-count // 64) * 64:].isnan().all(), (g, count, diff)
        print(f"sanitize masked expected={expected} counts={counts}: ok")


def contiguous() -> None:
    """Grouped contiguous, experts of 0 to 2300 rows: 128 x 192 tiles at N = 4096, so a narrow last N-block (its own
    B box) and the rotated walk, with padding blocks."""
    from deepgemm.reference import m_grouped_contiguous_reference

    align = deepgemm.get_m_alignment_for_contiguous_layout()
    rows = [1100, 2300, 0, 1400]
    segments = [-(-r // align) * align for r in rows]
    m_indices = torch.cat([torch.cat([torch.full((r,), g, dtype=torch.int32), torch.full((s - r,), -1, dtype=torch.int32)])
                           for g, (r, s) in enumerate(zip(rows, segments))]).cuda()
    total, n, k = sum(segments), 4096, 2048
    a, _ = random_operands(total, 8, k, "cuda", seed=5)
    bs = [random_operands(8, n, k, "cuda", seed=6 + g)[1] for g in range(len(rows))]
    b = (torch.stack([x[0] for x in bs]), torch.stack([x[1] for x in bs]))
    out = torch.full((total, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices)
    torch.cuda.synchronize()
    ref = m_grouped_contiguous_reference(a[0], a[1], b[0], b[1], m_indices, compute_dtype=torch.float64)
    diff = deepgemm.calc_diff(out.double(), ref)
    print(f"sanitize contiguous rows={rows} n={n} k={k}: calc_diff={diff:.2e}")
    assert diff < 1e-3 and not out.isnan().any()


def bf16() -> None:
    """BF16 GEMMs in every layout: M, N and K tails (a 1-row and a 7-row M, a 72-deep K), FP32 out with an FP32 C,
    and C as out (in-place accumulation)."""
    from deepgemm.reference import bf16_gemm_reference

    for layout in ("nt", "nn", "tn", "tt"):
        for m, n, k, out_dtype, c_dtype in ((1 if layout[0] == "n" else 8, 136, 72, torch.bfloat16, None),
                                            (7 if layout[0] == "n" else 72, 2056, 7296, torch.float32, torch.float32),
                                            (300 if layout[0] == "n" else 296, 4096, 512, torch.bfloat16, torch.bfloat16)):
            a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda").to(torch.bfloat16)
            b = torch.randn((n, k) if layout[1] == "t" else (k, n), device="cuda").to(torch.bfloat16)
            c = None if c_dtype is None else torch.randn(m, n, device="cuda").to(c_dtype)
            expected = bf16_gemm_reference(a, b, layout, c, torch.float64)
            out = c if c is not None and c.dtype == out_dtype else torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
            getattr(deepgemm, f"bf16_gemm_{layout}")(a, b, out, c=c)
            torch.cuda.synchronize()
            diff = deepgemm.calc_diff(out.double(), expected)
            print(f"sanitize bf16_gemm_{layout} m={m} n={n} k={k} out={out_dtype} c={c_dtype}: calc_diff={diff:.2e}")
            assert diff < 1e-4
    bf16_split_k()
    bf16_chunked()


def bf16_chunked() -> None:
    """Forced BF16-output chunked stores (cost_model.store_n_for): 128 x 224 in 32-column and 128 x 256 in 64-column
    chunks, with an M tail and an N tail whose last chunks lie past N; a BF16 C on the second."""
    from deepgemm.kernels.common.device import sm_count
    from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config
    from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem, get_bf16_plan
    from deepgemm.reference import bf16_gemm_reference

    for m, n, k, bn, c_dtype in ((300, 2056, 512, 224, None), (129, 2056, 200, 256, torch.bfloat16)):
        problem = bf16_problem(m, n, k, "nt", torch.bfloat16, c_dtype, sm_count(0))
        config = make_config(problem, 128, bn)
        assert config.store_n == {224: 32, 256: 64}[bn], config
        plan = get_bf16_plan(0, m, n, k, "nt", torch.bfloat16, c_dtype, config)
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        c = None if c_dtype is None else torch.randn(m, n, device="cuda").to(c_dtype)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        plan.launch(a, b, out, c)
        torch.cuda.synchronize()
        diff = deepgemm.calc_diff(out.double(), bf16_gemm_reference(a, b, "nt", c, torch.float64))
        print(f"sanitize {plan.spec.label()} m={m} n={n} k={k} c={c_dtype}: calc_diff={diff:.2e}")
        assert diff < 1e-4


def bf16_split_k() -> None:
    """Forced BF16 split-K builds: a second math warpgroup with no rows (M = 50 on 128-row tiles) with C as out, and
    ranges of one K block over N and K tails."""
    from deepgemm.kernels.common.device import sm_count
    from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config
    from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem, get_bf16_plan
    from deepgemm.reference import bf16_gemm_reference

    for layout, m, n, k, bm, bn in (("nt", 50, 2112, 7168, 128, 64), ("tn", 8, 136, 200, 64, 64)):
        problem = bf16_problem(m, n, k, layout, torch.float32, torch.float32, sm_count(0))
        plan = get_bf16_plan(0, m, n, k, layout, torch.float32, torch.float32, make_config(problem, bm, bn, True))
        a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda").to(torch.bfloat16)
        b = torch.randn((n, k) if layout[1] == "t" else (k, n), device="cuda").to(torch.bfloat16)
        out = torch.randn(m, n, device="cuda")
        expected = bf16_gemm_reference(a, b, layout, out, torch.float64)
        plan.launch(a, b, out, out)
        torch.cuda.synchronize()
        diff = deepgemm.calc_diff(out.double(), expected)
        print(f"sanitize {plan.spec.label()} m={m} splits={plan.splits}: calc_diff={diff:.2e}")
        assert plan.splits > 1 and diff < 1e-8


def bf16_grouped() -> None:
    """BF16 grouped kinds at their edges: contiguous with padding rows and an empty expert (N tail), masked with
    counts 0 / 1 / 65 / max_m and on a chunked BF16-output tile, k-grouped with an M tail (3-D stores clipped per
    group) and an empty group."""
    from deepgemm.reference import (k_grouped_bf16_reference, m_grouped_bf16_contiguous_reference,
                                    m_grouped_bf16_masked_reference)

    rows, n, k = [200, 0, 56, 128], 2056, 1000
    segments = [-(-r // 128) * 128 for r in rows]
    m_indices = torch.cat([torch.cat([torch.full((r,), g, dtype=torch.int32), torch.full((s - r,), -1, dtype=torch.int32)])
                           for g, (r, s) in enumerate(zip(rows, segments))]).cuda()
    a = torch.randn(sum(segments), k, device="cuda").to(torch.bfloat16)
    b = torch.randn(len(rows), n, k, device="cuda").to(torch.bfloat16)
    out = torch.full((sum(segments), n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.m_grouped_bf16_gemm_nt_contiguous(a, b, out, m_indices)
    torch.cuda.synchronize()
    diff = deepgemm.calc_diff(out.double(), m_grouped_bf16_contiguous_reference(a, b, m_indices, torch.float64))
    print(f"sanitize m_grouped_bf16 contiguous rows={rows} n={n} k={k}: calc_diff={diff:.2e}")
    assert diff < 1e-4 and not out.isnan().any()

    # Masked: counts 0 / 1 / 65 / max_m into FP32, and BF16 output on the model's 128 x 224 tile (32-column chunks)
    # with an N tail (7160 = 31 x 224 + 216).
    for counts, max_m, n, k, out_dtype, expected_m in (([0, 1, 65, 128], 128, 2056, 1000, torch.float32, 64),
                                                        ([1000, 65], 1024, 7160, 2048, torch.bfloat16, 512)):
        a = torch.randn(len(counts), max_m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(len(counts), n, k, device="cuda").to(torch.bfloat16)
        masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
        out = torch.full((len(counts), max_m, n), float("nan"), dtype=out_dtype, device="cuda")
        deepgemm.m_grouped_bf16_gemm_nt_masked(a, b, out, masked_m, expected_m)
        torch.cuda.synchronize()
        ref = m_grouped_bf16_masked_reference(a, b, masked_m, torch.float64)
        valid = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
        diff = deepgemm.calc_diff(out[valid].double(), ref[valid])
        print(f"sanitize m_grouped_bf16 masked counts={counts} n={n} k={k} out={out_dtype}: calc_diff={diff:.2e}")
        assert diff < 1e-4

    # C as out (reduce-add stores) and a separate C (loaded in the epilogue).
    ks = [256, 0, 384, 128]
    for m, n, in_place in ((136, 264, True), (200, 1032, False)):
        dy = torch.randn(sum(ks), m, device="cuda").to(torch.bfloat16)
        x = torch.randn(sum(ks), n, device="cuda").to(torch.bfloat16)
        c = torch.randn(len(ks), m, n, device="cuda")
        expected = k_grouped_bf16_reference(dy, x, ks, c, torch.float64)
        out = c if in_place else torch.full_like(c, float("nan"))
        deepgemm.k_grouped_bf16_gemm_tn_contiguous(dy, x, out, ks, c=c)
        torch.cuda.synchronize()
        diff = deepgemm.calc_diff(out.double(), expected)
        print(f"sanitize k_grouped_bf16 ks={ks} m={m} n={n} c={'out' if in_place else 'loaded'}: calc_diff={diff:.2e}")
        assert diff < 1e-6
    bf16_k_grouped_chunked(ks)


def bf16_k_grouped_chunked(ks: list[int]) -> None:
    """Forced 128 x 256 k-grouped builds (the 32-column chunked epilogue) with M and N tails, an empty group, C as
    out and a loaded C."""
    import dataclasses

    from deepgemm.api.bf16_grouped import _KGROUPED_WHERE, _offsets
    from deepgemm.kernels.common.kind import GemmKind
    from deepgemm.kernels.common.loader import load_kernel
    from deepgemm.kernels.sm90_bf16_gemm.cost_model import stages_for
    from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16Geometry, Bf16GemmPlan, grouped_spec
    from deepgemm.kernels.sm90_bf16_gemm.spec import render_source
    from deepgemm.reference import k_grouped_bf16_reference

    m, n = 200, 1032
    geometry = Bf16Geometry(m, len(ks))
    dy = torch.randn(sum(ks), m, device="cuda").to(torch.bfloat16)
    x = torch.randn(sum(ks), n, device="cuda").to(torch.bfloat16)
    offsets = _offsets.get(dy.device, tuple(ks), _KGROUPED_WHERE)
    for in_place in (True, False):
        spec = grouped_spec(GemmKind.K_GROUPED, geometry, n, 0, torch.float32, torch.float32, 0, 132, in_place)
        config = dataclasses.replace(spec.config, block_m=128, block_n=256, store_n=32,
                                     num_stages=stages_for(128, 256, 4, store_n=32))
        spec = dataclasses.replace(spec, config=config)
        plan = Bf16GemmPlan(0, geometry, spec, load_kernel(render_source(spec), spec.smem_bytes, 0))
        c = torch.randn(len(ks), m, n, device="cuda")
        expected = k_grouped_bf16_reference(dy, x, ks, c, torch.float64)
        out = c if in_place else torch.full_like(c, float("nan"))
        plan.launch(dy, x, out, None if in_place else c, offsets)
        torch.cuda.synchronize()
        diff = deepgemm.calc_diff(out.double(), expected)
        print(f"sanitize {spec.label()} m={m}: calc_diff={diff:.2e}")
        assert diff < 1e-6 and not out.isnan().any()


def softmax_and_rope() -> None:
    """The fused softmax (cached, cluster, streaming and scalar paths, causal rows, tails of a row group) and its
    backward, and RoPE on q / k views of one fused buffer (both pair layouts, partial rotary, the scalar path, an
    out-of-range position), each against float64."""
    from deepgemm.reference import rope_reference, softmax_reference

    for lead, n, dtype, causal in (((3, 5), 7, torch.float32, True), ((1,), 4104, torch.bfloat16, True),
                                   ((2,), 40000, torch.float32, False), ((37,), 100, torch.float16, False),
                                   ((3,), 100000, torch.bfloat16, False), ((2,), 300000, torch.bfloat16, True)):
        base = torch.randn(*lead, n + 1, device="cuda").to(dtype)
        x = base[..., 1:]  # misaligned rows: the scalar path
        for xs in (x, x.contiguous()):
            y = deepgemm.softmax(xs, scale=0.7, causal=causal)
            dx = deepgemm.api.softmax.softmax_backward(y, torch.randn_like(y), 0.7)
            torch.cuda.synchronize()
            ref = softmax_reference(xs.double(), 0.7, causal)
            assert (y.double() - ref).abs().max().item() < 1e-2 and not dx.isnan().any()
        print(f"sanitize softmax {tuple(lead)} x {n} {dtype} causal={causal}: ok")
    tokens, cache = 37, torch.randn(64, 32, device="cuda")
    positions = torch.randint(0, 64, (tokens,), device="cuda")
    positions[3] = 64  # out of range: NaN, no read
    for dtype, interleaved, pad in ((torch.bfloat16, False, 0), (torch.bfloat16, True, 0), (torch.float32, False, 3)):
        qkv = torch.randn(tokens, 8 * 48 + pad, device="cuda").to(dtype)  # pad 3: misaligned rows, the scalar path
        q, k = qkv[:, :6 * 48].view(tokens, 6, 48), qkv[:, 6 * 48 + pad:].view(tokens, 2, 48)
        expected = rope_reference(q.double(), cache.double(), positions, interleaved)
        q_out, _ = deepgemm.rope(q, k, cache, positions, interleaved=interleaved)
        deepgemm.rope_(q, k, cache, positions, interleaved=interleaved)
        torch.cuda.synchronize()
        for out in (q_out, q):
            assert torch.equal(out.isnan(), expected.isnan())
            assert (out.double() - expected).nan_to_num().abs().max().item() < 5e-2
        print(f"sanitize rope {dtype} interleaved={interleaved} pad={pad}: ok")


def fp8_training() -> None:
    """The transposing quantizers (alone and both ways; 16-byte and scalar paths, padded tokens, odd sizes), the
    per-block quantizer with its transpose, and an FP8 training step of deepgemm.fp8_linear on odd shapes."""
    from deepgemm.ops.quant import quantize_both_ways, quantize_per_block_transposed, quantize_transposed

    for t, c, dtype, pad in ((1, 1, torch.bfloat16, 0), (130, 72, torch.float32, 0), (300, 200, torch.bfloat16, 1),
                             (77, 4104, torch.float16, 0)):
        base = torch.randn(t, c + pad, device="cuda").to(dtype)
        x = base[:, pad:]  # pad 1: a misaligned base, the scalar path
        tokens = (t + 127) // 128 * 128
        qt, _ = quantize_transposed(x, tokens)
        q, _, qt2, _ = quantize_both_ways(x, tokens)
        torch.cuda.synchronize()
        assert torch.equal(qt.view(torch.uint8), qt2.view(torch.uint8)) and q.shape == (t, c)
        print(f"sanitize transposed quantizers {t} x {c} {dtype} pad={pad}: ok")
    for n, k in ((300, 200), (8, 24), (129, 4096)):
        q, sf, qt, sft = quantize_per_block_transposed(torch.randn(n, k, device="cuda"))
        torch.cuda.synchronize()
        assert torch.equal(qt.view(torch.uint8), q.t().contiguous().view(torch.uint8)) and torch.equal(sft, sf.t())
        print(f"sanitize quantize_per_block_transposed {n} x {k}: ok")
    for t, n, k in ((7, 64, 128), (129, 272, 400), (1000, 2112, 512)):
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(n, k, device="cuda") * 0.05).requires_grad_()
        b = torch.randn(n, device="cuda", requires_grad=True)
        y = deepgemm.fp8_linear(x, w, b)
        y.backward(torch.randn_like(y))
        torch.cuda.synchronize()
        ref = x.detach().double() @ w.detach().double().t() + b.detach().double()
        diff = deepgemm.calc_diff(y.detach().double(), ref)
        assert diff < 3e-3 and x.grad is not None and w.grad is not None and not w.grad.isnan().any()
        print(f"sanitize fp8_linear step {t} x {n} x {k}: calc_diff={diff:.2e}")


if __name__ == "__main__":
    main()
