"""fp8_gemm_nt(num_sms=): a per-call SM cap (issue 26 point 2), on CPU.

Validation on every path (reference path, a simulated kernel path, the launch-ready fast path, the custom ops and
their fake kernels); the plan a capped call makes (config planned for num_sms SMs, grid <= num_sms, the tuned entry
of that SM count); separate launch-ready entries per num_sms; and the distributed layers passing their cap.
The kernel path is simulated on CPU tensors: `backend_for` answers "sm90", the device is an H200 (132 SMs), and
plans are real `Fp8GemmPlan`s around a stand-in kernel whose launches are recorded instead of run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import deepgemm
from deepgemm.api import gemm as gemm_api
from deepgemm.api.tuned import TunedLookups
from deepgemm.kernels.sm90_fp8_gemm_1d2d import plan as plan_module
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics import choose_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Fp8GemmPlan, Geometry, get_plan
from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmProblem
from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec
from deepgemm.tuning.db import tuning_db
from tests.helpers import random_operands, reference_fp64

BF16 = torch.bfloat16
H200_SMS = 132
BAD_VALUES = [(0, ValueError), (-1, ValueError), (H200_SMS + 1, ValueError), (10**6, ValueError),
              (True, TypeError), (False, TypeError), (66.0, TypeError), ("66", TypeError), ([66], TypeError)]


def q(name: str) -> str:
    return re.escape(f"'{name}'")


class _StandInKernel:
    """What Fp8GemmPlan asks of a loaded kernel without a GPU: cluster occupancy (every SM pairs up)."""

    def max_active_clusters(self, device_index: int | None, block: int, cluster: int) -> int:
        return H200_SMS // cluster


class _RecordingPlan(Fp8GemmPlan):
    """A real plan (grid, config) whose argument packing and launch are recorded instead of run."""

    launched: list[tuple[Fp8GemmPlan, object]] = []

    def packed_args(self, *tensors: object, **kwargs: object) -> object:  # type: ignore[override]
        return ("args", self.spec.config.num_sms)

    def launch_packed(self, args: object) -> None:  # type: ignore[override]
        _RecordingPlan.launched.append((self, args))


def _plan(m: int, config, n: int, k: int, out_dtype: torch.dtype = BF16) -> Fp8GemmPlan:  # noqa: ANN001
    return Fp8GemmPlan(0, Geometry(rows=m), Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=config),
                       _StandInKernel())  # type: ignore[arg-type]


@pytest.fixture
def kernel_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[Fp8GemmPlan, object]]:
    """CPU tensors take the kernel path on a simulated H200; returns the launches (plan, packed arguments)."""
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "cache"))  # no user tuning file: the shipped one only
    monkeypatch.delenv("DEEPGEMM_AUTOTUNE", raising=False)
    monkeypatch.setattr(gemm_api, "backend_for", lambda *tensors, **kw: "sm90")
    monkeypatch.setattr(gemm_api, "sm_count", lambda index: H200_SMS)
    monkeypatch.setattr(gemm_api, "device_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(gemm_api, "_tuned", TunedLookups())
    monkeypatch.setattr(gemm_api, "_ready", {})
    monkeypatch.setattr(plan_module, "sm_count", lambda index: H200_SMS)
    monkeypatch.setattr(plan_module, "_plans", {})

    def build(table, key, index, geometry, spec, what):  # noqa: ANN001, ANN202
        return table.setdefault(key, _RecordingPlan(index, geometry, spec, _StandInKernel()))  # type: ignore[arg-type]

    monkeypatch.setattr(plan_module, "_build", build)
    launched: list[tuple[Fp8GemmPlan, object]] = []
    monkeypatch.setattr(_RecordingPlan, "launched", launched)
    return launched


# ---------------------------------------------------------------- validation on every path


def _outcome(call) -> tuple[type, str] | None:  # noqa: ANN001
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the outcome is compared, whatever it is
        return type(error), str(error)
    return None


@pytest.mark.parametrize(("bad", "error"), BAD_VALUES, ids=repr)
def test_bad_num_sms_is_refused_alike_on_the_reference_and_kernel_paths(
        bad: object, error: type, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b = random_operands(8, 136, 256, "cpu", seed=1)
    out = torch.empty(8, 136, dtype=BF16)
    calls = [lambda: deepgemm.fp8_gemm_nt(a, b, num_sms=bad), lambda: deepgemm.fp8_gemm_nt(a, b, out, num_sms=bad),
             lambda: deepgemm.fp8_gemm_nt(a, b, out_dtype=torch.float32, num_sms=bad)]
    reference = [_outcome(call) for call in calls]
    with monkeypatch.context() as patch:
        patch.setattr(gemm_api, "backend_for", lambda *tensors, **kw: "sm90")
        patch.setattr(gemm_api, "get_plan", lambda *args, **kw: pytest.fail("planned despite a bad num_sms"))
        kernel = [_outcome(call) for call in calls]
    assert reference == kernel
    for result in reference:
        assert result is not None and result[0] is error and "'num_sms'" in result[1], result


@pytest.mark.parametrize(("bad", "error"), [(value, error) for value, error in BAD_VALUES if type(value) is not bool],
                         ids=repr)
def test_bad_num_sms_is_refused_by_the_ops_and_their_fake_kernels(bad: object, error: type) -> None:
    """The ops' kernels and fake kernels raise the eager message; a non-int never gets past the dispatcher's `int?`
    check (a bool does, as 0 or 1: the public function refuses it before the op, eagerly and under Dynamo)."""
    a, b = random_operands(8, 136, 256, "cpu", seed=2)
    out = torch.empty(8, 136, dtype=torch.float32)
    eager = _outcome(lambda: deepgemm.fp8_gemm_nt(a, b, out, num_sms=bad))
    assert eager is not None and eager[0] is error and "'num_sms'" in eager[1]
    if error is TypeError:
        for call in (lambda: torch.ops.deepgemm.fp8_gemm_nt(a[0], a[1], b[0], b[1], None, bad),
                     lambda: torch.ops.deepgemm.fp8_gemm_nt_out(a[0], a[1], b[0], b[1], out, bad)):
            with pytest.raises(RuntimeError, match="num_sms"):
                call()
        return
    assert _outcome(lambda: torch.ops.deepgemm.fp8_gemm_nt(a[0], a[1], b[0], b[1], None, bad)) == eager
    assert _outcome(lambda: torch.ops.deepgemm.fp8_gemm_nt_out(a[0], a[1], b[0], b[1], out, bad)) == eager
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t) for t in (a[0], a[1], b[0], b[1], out)]
    with mode:
        assert _outcome(lambda: torch.ops.deepgemm.fp8_gemm_nt(*fakes[:4], None, bad)) == eager
        assert _outcome(lambda: torch.ops.deepgemm.fp8_gemm_nt_out(*fakes, bad)) == eager


def test_good_num_sms_values_give_the_reference_result() -> None:
    a, b = random_operands(37, 200, 384, "cpu", seed=3)
    expected = deepgemm.fp8_gemm_nt(a, b)
    for value in (1, 2, 33, 66, H200_SMS, None):
        assert torch.equal(deepgemm.fp8_gemm_nt(a, b, num_sms=value), expected)
        assert torch.equal(torch.ops.deepgemm.fp8_gemm_nt(a[0], a[1], b[0], b[1], None, value), expected)
    assert deepgemm.calc_diff(expected.double(), reference_fp64(a, b)) < 1e-3


def test_the_schemas_take_an_optional_num_sms_and_old_calls_still_work() -> None:
    for name in ("fp8_gemm_nt", "fp8_gemm_nt_out"):
        schema = getattr(torch.ops.deepgemm, name).default._schema
        argument = schema.arguments[-1]
        assert argument.name == "num_sms" and str(argument.type) == "Optional[int]" and argument.default_value is None
    a, b = random_operands(8, 136, 256, "cpu", seed=4)
    out = torch.empty(8, 136, dtype=torch.float32)
    torch.ops.deepgemm.fp8_gemm_nt_out(a[0], a[1], b[0], b[1], out)  # written before num_sms existed
    assert torch.equal(out, torch.ops.deepgemm.fp8_gemm_nt(a[0], a[1], b[0], b[1], torch.float32))
    assert torch.equal(out, torch.ops.deepgemm.fp8_gemm_nt(a[0], a[1], b[0], b[1], torch.float32, num_sms=66))


def test_torch_compile_keeps_num_sms_in_the_graph() -> None:
    """fullgraph: no break; the op node carries the value; another value gives the same (reference) result."""
    import torch._dynamo

    _, b = random_operands(8, 200, 256, "cpu", seed=9)

    def layer(x: torch.Tensor, num_sms: int | None) -> torch.Tensor:
        return deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(x), b, num_sms=num_sms)

    x = torch.randn(37, 256, dtype=BF16)
    explained = torch._dynamo.explain(layer)(x, 66)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    nodes = [node for graph in explained.graphs for node in graph.graph.nodes if "fp8_gemm_nt" in str(node.target)]
    assert len(nodes) == 1 and nodes[0].args[4:] == (None, 66)
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for value in (66, 32, None):
        assert torch.equal(compiled(x, value), layer(x, value))


# ---------------------------------------------------------------- the plan of a capped call


def test_a_capped_call_plans_for_its_sms_and_launches_at_most_that_many_ctas(
        kernel_path: list[tuple[Fp8GemmPlan, object]]) -> None:
    m, n, k = 4096, 2112, 7168  # 544 tiles of 128x128: a full wave on 132 SMs and on 66
    a, b = random_operands(m, n, k, "cpu", seed=5)
    out = torch.empty(m, n, dtype=BF16)
    deepgemm.fp8_gemm_nt(a, b, out, num_sms=66)
    deepgemm.fp8_gemm_nt(a, b, out)
    (capped, _), (full, _) = kernel_path
    assert capped.spec.config.num_sms == 66 and capped.grid <= 66
    assert full.spec.config.num_sms == H200_SMS and 66 < full.grid <= H200_SMS
    # The default reads the H200's shipped tuned entry (keyed by 132 SMs); the capped call has none for 66 SMs and
    # takes the cost model's choice for 66.
    shipped = tuning_db("NVIDIA H200").lookup(m, n, k, H200_SMS)
    assert shipped is not None and full.spec.config == shipped
    assert tuning_db("NVIDIA H200").lookup(m, n, k, 66) is None
    assert capped.spec.config == choose_config(GemmProblem(m, n, k, 66, BF16))


def test_the_launch_ready_entry_is_per_num_sms(kernel_path: list[tuple[Fp8GemmPlan, object]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    m, n, k = 256, 2112, 1024
    a, b = random_operands(m, n, k, "cpu", seed=6)
    out = torch.empty(m, n, dtype=BF16)
    for value in (66, None, 32, H200_SMS):  # cold: each plans (checked path) and is remembered
        deepgemm.fp8_gemm_nt(a, b, out, num_sms=value)
    plans = {value: plan for value, (plan, _) in zip((66, None, 32, H200_SMS), kernel_path, strict=True)}
    assert {value: plan.spec.config.num_sms for value, plan in plans.items()} == {
        66: 66, None: H200_SMS, 32: 32, H200_SMS: H200_SMS}
    assert len({id(plans[66]), id(plans[None]), id(plans[32])}) == 3
    keys = {gemm_api._metadata_key(a[0], a[1], b[0], b[1], out, value) for value in plans}
    assert keys <= set(gemm_api._ready) and len(keys) == 4
    # Warm: each value launches its own plan from the fast path (no validation, no planning).
    kernel_path.clear()
    monkeypatch.setattr(gemm_api, "check_fp8_gemm_nt", lambda *args: pytest.fail("a warm call was validated"))
    monkeypatch.setattr(gemm_api, "get_plan", lambda *args: pytest.fail("a warm call planned"))
    for value in (32, None, 66, 32, H200_SMS):
        assert deepgemm.fp8_gemm_nt(a, b, out, num_sms=value) is out
    assert [plan for plan, _ in kernel_path] == [plans[32], plans[None], plans[66], plans[32], plans[H200_SMS]]
    assert [args for _, args in kernel_path] == [("args", 32), ("args", H200_SMS), ("args", 66), ("args", 32),
                                                 ("args", H200_SMS)]


@pytest.mark.parametrize(("out_dtype", "row"), [(BF16, 24), (torch.float32, 20)])
def test_warm_allocating_calls_return_fresh_padded_outputs(kernel_path: list[tuple[Fp8GemmPlan, object]],
                                                           monkeypatch: pytest.MonkeyPatch, out_dtype: torch.dtype,
                                                           row: int) -> None:
    """A warm call without `out` (FreshOutputs) allocates a new [M, N] output of the requested dtype on the operands'
    device each time, over rows padded to 16 bytes (N = 18: 24 BF16 or 20 FP32 elements), as the checked call did."""
    monkeypatch.setattr(gemm_api, "_fresh", {})
    a, b = random_operands(64, 18, 256, "cpu", seed=8)
    first = deepgemm.fp8_gemm_nt(a, b, out_dtype=out_dtype)
    monkeypatch.setattr(gemm_api, "check_fp8_gemm_nt", lambda *args: pytest.fail("a warm call was validated"))
    kept = [deepgemm.fp8_gemm_nt(a, b, out_dtype=out_dtype) for _ in range(3)]
    for out in [first, *kept]:
        assert (out.shape, out.stride(), out.dtype, out.device) == ((64, 18), (row, 1), out_dtype, a[0].device)
        assert not out.requires_grad
    assert len({out.data_ptr() for out in [first, *kept]}) == 4 and len(kernel_path) == 4


def test_values_equal_to_a_remembered_int_do_not_take_the_fast_path(
        kernel_path: list[tuple[Fp8GemmPlan, object]]) -> None:
    """True == 1 and 66.0 == 66 hash alike: a remembered num_sms=1 / 66 entry must not serve them."""
    a, b = random_operands(64, 256, 512, "cpu", seed=7)
    out = torch.empty(64, 256, dtype=BF16)
    deepgemm.fp8_gemm_nt(a, b, out, num_sms=1)
    deepgemm.fp8_gemm_nt(a, b, out, num_sms=66)
    assert gemm_api._metadata_key(a[0], a[1], b[0], b[1], out, True) in gemm_api._ready
    for bad in (True, 66.0):
        with pytest.raises(TypeError, match=q("num_sms")):
            deepgemm.fp8_gemm_nt(a, b, out, num_sms=bad)
    assert len(kernel_path) == 2


def test_an_explicit_num_sms_is_not_capped_by_deepgemm_num_sms(
        kernel_path: list[tuple[Fp8GemmPlan, object]], monkeypatch: pytest.MonkeyPatch) -> None:
    """DEEPGEMM_NUM_SMS caps the default only (the device count as sm_count reports it); a call's own value is the
    plan's, as precompile_fp8_gemm_nt(num_sms=) builds it."""
    for module in (gemm_api, plan_module):
        monkeypatch.setattr(module, "sm_count", lambda index: 100)  # as DEEPGEMM_NUM_SMS=100 makes it
    a, b = random_operands(4096, 1024, 512, "cpu", seed=8)
    out = torch.empty(4096, 1024, dtype=BF16)
    deepgemm.fp8_gemm_nt(a, b, out)
    deepgemm.fp8_gemm_nt(a, b, out, num_sms=120)
    (default, _), (explicit, _) = kernel_path
    assert default.spec.config.num_sms == 100 and default.grid <= 100
    assert explicit.spec.config.num_sms == 120 and 100 < explicit.grid <= 120
    assert explicit.spec == gemm_api.planned_spec(4096, 1024, 512, BF16, 120, "NVIDIA H200")  # precompile's


@pytest.mark.parametrize("num_sms", [1, 2, 3, 17, 31, 32, 33, 64, 66, 97, 114, 131, 132])
def test_the_grid_never_exceeds_num_sms(num_sms: int) -> None:
    """Cost-model configs (split tails, balanced grids included) and 2-CTA cluster configs, over shapes from one
    tile to many waves."""
    for m, n, k in ((1, 8, 128), (64, 2112, 7168), (129, 4096, 7296), (1000, 136, 7168), (4096, 7168, 2048),
                    (8192, 24576, 1536), (4097, 7168, 7296)):
        for out_dtype in (BF16, torch.float32):
            config = choose_config(GemmProblem(m, n, k, num_sms, out_dtype))
            assert config.num_sms == num_sms
            plan = _plan(m, config, n, k, out_dtype)
            assert 1 <= plan.grid <= num_sms, (m, n, k, config.label(), plan.grid)
        if m >= 256 and num_sms % 2 == 0:
            clustered = make_config(m, n, k, 128, 128, num_sms, cluster_m=2)
            assert 2 <= _plan(m, clustered, n, k).grid <= num_sms


def test_get_plan_keys_and_checks_num_sms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "sm_count", lambda index: H200_SMS)
    monkeypatch.setattr(plan_module, "_plans", {})
    monkeypatch.setattr(plan_module, "_build", lambda table, key, index, geometry, spec, what:
                        table.setdefault(key, _plan(geometry.rows, spec.config, spec.n, spec.k, spec.out_dtype)))
    capped, full = get_plan(0, 4096, 2112, 7168, BF16, num_sms=40), get_plan(0, 4096, 2112, 7168, BF16)
    assert capped is get_plan(0, 4096, 2112, 7168, BF16, num_sms=40) and capped is not full
    assert (capped.spec.config.num_sms, full.spec.config.num_sms) == (40, H200_SMS) and capped.grid <= 40
    config = make_config(4096, 2112, 7168, 128, 128, 40)
    assert get_plan(0, 4096, 2112, 7168, BF16, config, 40).spec.config == config
    with pytest.raises(ValueError, match=q("num_sms")):
        get_plan(0, 4096, 2112, 7168, BF16, config, 66)


# ---------------------------------------------------------------- the tuned database at the requested SM count


def test_tuned_config_reads_and_autotunes_the_requested_sm_count(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DEEPGEMM_AUTOTUNE", raising=False)
    monkeypatch.setattr(gemm_api, "sm_count", lambda index: H200_SMS)
    monkeypatch.setattr(gemm_api, "device_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(gemm_api, "_tuned", TunedLookups())
    m, n, k = 512, 3072, 1536
    recorded = make_config(m, n, k, 64, 96, 66)
    tuning_db("NVIDIA H200").record(m, n, k, 66, recorded, 12.5)
    at_66 = gemm_api.tuned_config(0, m, n, k, BF16, 66)
    assert at_66 is not None and (at_66.block_m, at_66.block_n, at_66.num_sms) == (64, 96, 66)
    assert gemm_api.tuned_config(0, m, n, k, BF16) is None  # 132 SMs: no entry
    assert gemm_api.tuned_config(0, m, n, k, BF16, 40) is None
    asked: list[dict] = []
    monkeypatch.setenv("DEEPGEMM_AUTOTUNE", "1")
    monkeypatch.setattr(gemm_api, "tune_fp8_gemm_nt", lambda *args, **kwargs: asked.append(kwargs))
    gemm_api.tuned_config(0, 1024, n, k, BF16, 50)
    gemm_api.tuned_config(0, 1024, n, k, BF16)
    assert [kwargs["num_sms"] for kwargs in asked] == [50, H200_SMS]


# ---------------------------------------------------------------- the distributed layers pass their cap


def test_parallel_layers_pass_num_sms_to_the_gemm(monkeypatch: pytest.MonkeyPatch, small_fp8_route: int) -> None:
    """One gloo rank in this process: every FP8 GEMM of both layers (plain and sequence-parallel, chunked) gets the
    layer's cap; the result does not depend on it (CPU reference path)."""
    import torch.distributed as dist

    from deepgemm.api import gemm as gemm_api
    from deepgemm.distributed import ColumnParallelFp8Linear, RowParallelFp8Linear

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed, not yet initialized in this process")
    seen: list[int | None] = []
    original = gemm_api.fp8_gemm_nt

    def gemm(a, b, out=None, *, out_dtype=None, num_sms=None):  # noqa: ANN001, ANN202
        seen.append(num_sms)
        return original(a, b, out, out_dtype=out_dtype, num_sms=num_sms)

    # Where every FP8 GEMM of the layers lands (the eager fp8_linear path and the ops wrapper alike).
    monkeypatch.setattr(gemm_api, "fp8_gemm_nt", gemm)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.randn(6, 256, dtype=BF16)
        for cls in (ColumnParallelFp8Linear, RowParallelFp8Linear):
            for options in ({}, {"sequence_parallel": True, "chunks": 3}):
                layer = cls.from_linear(torch.nn.Linear(256, 384, dtype=BF16), num_sms=48, **options)
                assert layer.route == "fp8" and "num_sms=48" in repr(layer)
                seen.clear()
                capped = layer(x)
                assert seen and set(seen) == {48}, seen
                layer.num_sms = None
                seen.clear()
                assert torch.equal(layer(x), capped) and seen and set(seen) == {None}
        with pytest.raises(ValueError, match=q("num_sms")):
            ColumnParallelFp8Linear(256, 384, num_sms=0)
    finally:
        dist.destroy_process_group()
