"""K-grouped FP8 GEMM (expert Wgrad) on CPU tensors: reference math vs float64, argument checks, sm_90a builds."""

from __future__ import annotations

import pytest
import torch

import deepgemm
from deepgemm.reference import dequantize_per_token_group


def _operands(m: int, n: int, k_total: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    a = deepgemm.quantize_per_token_group(torch.randn(m, k_total, generator=gen) * 3)
    b = deepgemm.quantize_per_token_group(torch.randn(n, k_total, generator=gen))
    return a, b


def test_reference_matches_per_group_float64_with_accumulate() -> None:
    ks = [256, 0, 128, 384]
    m, n = 40, 24
    a, b = _operands(m, n, sum(ks), 0)
    c = torch.randn(len(ks), m, n)
    out = torch.full((len(ks), m, n), float("nan"))
    result = deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks, c=c)
    assert result is out
    a64 = dequantize_per_token_group(a[0], a[1], 128, torch.float64)
    b64 = dequantize_per_token_group(b[0], b[1], 128, torch.float64)
    begin = 0
    for g, k in enumerate(ks):
        expected = c[g].double() + a64[:, begin:begin + k] @ b64[:, begin:begin + k].t()
        assert deepgemm.calc_diff(out[g], expected) < 1e-6
        begin += k
    assert torch.equal(out[1], c[1])  # an empty group only carries C


def test_in_place_accumulate_and_no_c() -> None:
    ks = [128, 256]
    a, b = _operands(16, 8, 384, 1)
    plain = torch.empty(2, 16, 8)
    deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, plain, ks)
    acc = torch.ones(2, 16, 8)
    deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, acc, ks, c=acc)
    assert torch.allclose(acc, plain + 1, atol=1e-5)


def test_validation_names_arguments() -> None:
    ks = [128, 256]
    a, b = _operands(16, 8, 384, 2)
    out = torch.empty(2, 16, 8)
    fn = deepgemm.k_grouped_fp8_gemm_tn_contiguous
    with pytest.raises(ValueError, match="ks\\[1\\]"):
        fn(a, b, out, [128, 200])
    with pytest.raises(ValueError, match="sums to"):
        fn(a, b, out, [128, 128])
    with pytest.raises(TypeError, match="ks\\[0\\]"):
        fn(a, b, out, [128.0, 256])
    with pytest.raises(TypeError, match="ks"):
        fn(a, b, out, "128")
    with pytest.raises(ValueError, match="out"):
        fn(a, b, torch.empty(2, 16, 9), ks)
    with pytest.raises(TypeError, match="out"):
        fn(a, b, out.bfloat16(), ks)
    with pytest.raises(ValueError, match="'c'"):
        fn(a, b, out, ks, c=torch.empty(3, 16, 8))
    with pytest.raises(ValueError, match="b\\[0\\]"):
        fn(a, (b[0][:, :256], b[1][:, :2]), out, ks)
    with pytest.raises(ValueError, match="a\\[1\\]"):
        fn((a[0], a[1][:, :2]), b, out, ks)
    with pytest.raises(TypeError, match="ks\\[0\\]"):
        fn(a, b, out, [True, 256])


def test_empty_groups_and_numpy_ks() -> None:
    np = pytest.importorskip("numpy")
    a, b = _operands(8, 8, 128, 3)
    out = torch.full((3, 8, 8), float("nan"))
    deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, np.array([0, 128, 0]))
    assert (out[0] == 0).all() and (out[2] == 0).all() and not out[1].isnan().any()


@pytest.mark.parametrize("m,n,c_in_place,store_n", [
    (7168, 4096, False, None), (7168, 2048, True, None), (4096, 7168, True, None), (4100, 2056, False, None),
    (4100, 2056, True, None), (100, 36, True, None), (100, 48, False, None), (129, 7, False, None),
    (4096, 7168, True, 16), (4096, 7168, False, 0),  # the probe's variants: 16-column chunks, register stores
])
@pytest.mark.parametrize("group_rows", [1, 16])
def test_kernel_builds_for_sm90a_without_spills(m: int, n: int, c_in_place: bool, store_n: int | None,
                                                group_rows: int) -> None:
    """TMA-stored outputs (N % 4 == 0; 32- and 16-column staging chunks), in place by reduce-add, and N = 7 (or any
    N, on request) written from registers."""
    from deepgemm.kernels.sm90_fp8_gemm_1d1d.spec import KGroupedSpec, compile_spec, kgrouped_smem_bytes
    from tests.cpu.test_kernel_builds import assert_waits_for_previous_grid

    spec = KGroupedSpec.for_shape(m, n, c_in_place, store_n, group_rows)
    assert spec.block_n % 16 == 0 and spec.block_n >= min(n, 160)
    assert spec.store_n == (store_n if store_n is not None else 0 if n % 4 else 32 if spec.block_n % 32 == 0 else 16)
    bigger = kgrouped_smem_bytes(spec.block_n, spec.num_stages + 1, spec.store_n)
    assert spec.smem_bytes <= 232_448 < bigger or spec.num_stages == 16
    assert spec.num_stages >= (6 if spec.store_n in (0, 16) and spec.block_n == 128 else 5)
    compiled = compile_spec(spec)
    resources = compiled.resources
    assert resources is not None
    assert (resources.spill_stores, resources.spill_loads, resources.stack_frame) == (0, 0, 0)
    assert_waits_for_previous_grid(f"k-grouped {m}x{n}", compiled.cubin_path)


@pytest.mark.parametrize("m,n,c_in_place,store_n,group_rows", [
    (4096, 7168, True, None, 1), (7168, 2048, True, None, 1), (4096, 7168, False, None, 1), (4096, 7168, False, 0, 1),
    (4100, 2056, True, 16, 16), (100, 36, True, None, 1), (129, 7, False, None, 1),
])
@pytest.mark.parametrize("block_n", [144, 160])
def test_wide_tiles_build_without_spills(m: int, n: int, c_in_place: bool, store_n: int | None, group_rows: int,
                                         block_n: int) -> None:
    """The probe's wider tiles (scale products formed after the wait; 160 columns with a rolled K loop) in every
    epilogue: 0 spills, 0 stack, and the stage counts the smem mirror gives (TMA stores: 144 six stages with
    16-column chunks, 160 five; register stores six)."""
    from deepgemm.kernels.sm90_fp8_gemm_1d1d.spec import KGroupedSpec, compile_spec
    from tests.cpu.test_kernel_builds import assert_waits_for_previous_grid

    spec = KGroupedSpec.for_shape(m, n, c_in_place, store_n, group_rows, block_n)
    assert spec.block_n == block_n
    assert spec.num_stages == (6 if spec.store_n == 0 or (block_n == 144 and spec.store_n == 16) else 5)
    compiled = compile_spec(spec)
    resources = compiled.resources
    assert resources is not None
    assert (resources.spill_stores, resources.spill_loads, resources.stack_frame) == (0, 0, 0), spec.label()
    assert_waits_for_previous_grid(spec.label(), compiled.cubin_path)


def test_raster_band_rule() -> None:
    """Bands of 8 M-blocks where N spans at least 17 N-blocks (the H100 measurement in kgrouped_group_rows), the
    plain order elsewhere; explicit bands (the probe's) are kept."""
    from deepgemm.kernels.sm90_fp8_gemm_1d1d.spec import KGroupedSpec, kgrouped_group_rows

    expected = {(4096, 7168): 8, (7168, 7168): 8, (4096, 4096): 8, (7168, 2048): 1, (4100, 2056): 1, (1100, 2728): 8,
                (1100, 2560): 1, (300, 2728): 3, (128, 7168): 1, (100, 36): 1, (129, 7): 1, (0, 7168): 1}
    for (m, n), rows in expected.items():
        spec = KGroupedSpec.for_shape(m, n, c_in_place=n % 4 == 0)
        assert spec.group_rows == rows == kgrouped_group_rows(m, n, spec.block_n), (m, n, spec.label())
        assert spec.label().endswith(f" g{rows}") == (rows > 1)
    assert KGroupedSpec.for_shape(4096, 7168, group_rows=1).group_rows == 1
    assert KGroupedSpec.for_shape(7168, 2048, group_rows=16).group_rows == 16


def test_spec_refuses_inconsistent_epilogues() -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d1d.spec import KGroupedSpec

    with pytest.raises(ValueError, match="store_n 32"):
        KGroupedSpec.for_shape(129, 7, store_n=32)  # N % 4 != 0: no TMA stores
    with pytest.raises(ValueError, match="store_n 32"):
        KGroupedSpec.for_shape(100, 48, store_n=32)  # block_n 48: 32-column chunks do not divide it
    with pytest.raises(ValueError, match="in-place reduce-add stores are TMA stores"):
        KGroupedSpec.for_shape(4096, 7168, c_in_place=True, store_n=0)
    with pytest.raises(ValueError, match="in-place reduce-add stores are TMA stores"):
        KGroupedSpec.for_shape(129, 7, c_in_place=True)
    for block_n in (152, 176, 0):
        with pytest.raises(ValueError, match=r"block_n must be a multiple of 16 in \[16, 160\]"):
            KGroupedSpec.for_shape(4096, 7168, block_n=block_n)


def test_kernel_path_validation_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks that guard the GPU kernel (alignment, TMA rows, 32-bit K) run before any launch."""
    import deepgemm.api.kgrouped as api

    launches = []

    class FakePlan:
        def launch(self, *args) -> None:
            launches.append(args)

    monkeypatch.setattr(api, "backend_for", lambda *tensors: "sm90")
    planned: list[bool] = []

    def get_plan(device: int, m: int, n: int, c_in_place: bool) -> FakePlan:
        planned.append(c_in_place)
        return FakePlan()

    monkeypatch.setattr(api, "get_kgrouped_plan", get_plan)
    monkeypatch.setattr(api._offsets, "get", lambda device, ks: torch.tensor([0, *ks]).cumsum(0).int())
    ks = [128, 256]
    a, b = _operands(16, 8, 384, 4)
    fn = deepgemm.k_grouped_fp8_gemm_tn_contiguous
    out = torch.empty(2, 16, 8)
    fn(a, b, out, ks)
    assert len(launches) == 1 and launches[0][-2] is out and launches[0][-1] is None
    c = torch.empty_like(out)
    fn(a, b, out, ks, c=c)  # C loaded
    fn(a, b, out, ks, c=out)  # in place: the plan adds into out and gets no C
    assert planned == [False, False, True] and launches[1][-1] is c and launches[2][-1] is None
    misaligned = torch.empty(2 * 16 * 8 + 1)[1:].view(2, 16, 8)
    with pytest.raises(ValueError, match="'out'.*16-byte"):
        fn(a, b, misaligned, ks)
    with pytest.raises(ValueError, match="'c'"):
        fn(a, b, out, ks, c=misaligned)
    with pytest.raises(ValueError, match="'c'"):
        fn(a, b, out, ks, c=torch.empty(2, 8, 16).transpose(1, 2))
    one_row = (torch.zeros(1, 1, dtype=torch.float8_e4m3fn).expand(1, 384), a[1][:1])
    with pytest.raises(ValueError, match="a\\[0\\]"):
        fn(one_row, b, torch.empty(2, 1, 8), ks)
    strided = (torch.zeros(8, 768, dtype=torch.float8_e4m3fn)[:, ::2], b[1])
    with pytest.raises(ValueError, match="b\\[0\\]"):
        fn(a, strided, out, ks)
    monkeypatch.setattr(api, "MAX_ROWS", 256)
    with pytest.raises(ValueError, match="K_total=384"):
        fn(a, b, out, ks)
    assert len(launches) == 3  # none since the first three


def test_validated_ks_memo_keeps_the_type_rules() -> None:
    """A ks list seen before skips the per-group loop, but equal floats or bools are still rejected."""
    from deepgemm.api.kgrouped import check_ks

    sizes = [128 * (g % 5) for g in range(256)]
    assert check_ks(sizes, "w") == tuple(sizes)
    assert check_ks(tuple(sizes), "w") == tuple(sizes)  # a hit: same values
    with pytest.raises(TypeError, match=r"ks\[0\]"):
        check_ks([0.0] + sizes[1:], "w")
    with pytest.raises(TypeError, match=r"ks\[0\]"):
        check_ks([False] + sizes[1:], "w")
    with pytest.raises(ValueError, match=r"ks\[1\]"):
        check_ks([0, 100], "w")
    with pytest.raises(ValueError, match=r"ks\[1\]"):
        check_ks([0, 100], "w")  # a failed list is never remembered


@pytest.mark.parametrize("unordered", [{0, 128, 256}, frozenset({0, 128}), {0: 1, 128: 2}])
def test_unordered_ks_are_refused(unordered: object) -> None:
    """A set's (or mapping's) iteration order is not the groups' order: {0, 128, 256} iterates as 0, 256, 128, which
    ran group 1 on group 2's tokens without an error."""
    from deepgemm.api.kgrouped import check_ks

    with pytest.raises(TypeError, match="'ks' must be an ordered sequence"):
        check_ks(unordered, "w")
    assert check_ks(iter([0, 128, 256]), "w") == (0, 128, 256)  # an iterator is ordered
