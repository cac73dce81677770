"""GPU test selection: `full` is every test marked `gpu`; `quick` is the subset every GPU check runs
(dev/gpu_check.sh `tests`: `-m "gpu and quick"`, meant to finish within 5 minutes on an H200, compiles included).

The existing modules' quick tests are named here rather than marked in place, so the whole selection reads in one
list; tests written since carry `pytest.mark.quick` themselves. tests/gpu/test_markers.py (a CPU test) checks that
every name below still names a collected test. The memcheck subset is not a marker: it is dev/sanitize_check.py,
which gpu_check runs plainly (`smoke`) and under compute-sanitizer memcheck (`sanitize`).
"""

from __future__ import annotations

import warnings

import pytest

# "file.py" (the whole module), "file.py::test" (every parametrization) or "file.py::test[id]" (one).
QUICK = (
    # dense: the DeepSeek-V3 shapes at decode / prefill M, odd shapes at the edges (M = 1, N = 8, K tails, a
    # 1-row last block, N tails that straddle scale blocks), FP32 output, empty / padded / misaligned, graphs
    "test_fp8_gemm_gpu.py::test_main_shapes",
    "test_fp8_gemm_gpu.py::test_odd_shapes[1-8-128]",
    "test_fp8_gemm_gpu.py::test_odd_shapes[1-7168-7296]",
    "test_fp8_gemm_gpu.py::test_odd_shapes[7-136-144]",
    "test_fp8_gemm_gpu.py::test_odd_shapes[63-2056-7168]",
    "test_fp8_gemm_gpu.py::test_odd_shapes[65-7168-144]",
    "test_fp8_gemm_gpu.py::test_odd_shapes[129-2056-7296]",
    "test_fp8_gemm_gpu.py::test_odd_shapes[1000-136-7168]",
    "test_fp8_gemm_gpu.py::test_odd_shapes[4097-7168-7296]",
    "test_fp8_gemm_gpu.py::test_odd_shapes[4097-8-144]",
    "test_fp8_gemm_gpu.py::test_fp32_output",
    "test_fp8_gemm_gpu.py::test_natural_scale_layout_matches_mn_major",
    "test_fp8_gemm_gpu.py::test_unaligned_n_allocates_padded_rows",
    "test_fp8_gemm_gpu.py::test_empty_dimensions",
    "test_fp8_gemm_gpu.py::test_misaligned_rows_are_rejected",
    "test_fp8_gemm_gpu.py::test_cuda_graph_capture_and_replay",
    "test_fp8_gemm_gpu.py::test_capturing_a_cold_shape_raises",
    # grouped: contiguous (m_indices and psum forms) and masked, the basic cases and graph replay
    "test_grouped_gpu.py::test_contiguous",
    "test_grouped_gpu.py::test_contiguous_psum_matches_m_indices_form",
    "test_grouped_gpu.py::test_contiguous_psum_graph_replay_with_new_ends",
    "test_grouped_gpu.py::test_contiguous_rejects_unaligned_total",
    "test_grouped_gpu.py::test_masked",
    "test_grouped_gpu.py::test_masked_graph_replay_with_new_counts",
    # k-grouped: against float64 with and without C, graph replay, offsets used from a side stream
    "test_kgrouped_gpu.py::test_k_grouped_against_float64",
    "test_kgrouped_gpu.py::test_k_grouped_cuda_graph_replay",
    "test_kgrouped_gpu.py::test_k_grouped_new_ks_then_side_stream",
    # quantizers, custom ops / torch.compile / deepgemm.nn: whole modules
    "test_quantize_gpu.py",
    "test_ops_gpu.py",
)


def _parse(pattern: str) -> tuple[str, str | None]:
    file, _, test = pattern.partition("::")
    return file, test or None


def _matches(item: pytest.Item, pattern: str) -> bool:
    file, test = _parse(pattern)
    if item.path.name != file:
        return False
    if test is None:
        return True
    if "[" in test:
        return item.name == test
    return getattr(item, "originalname", item.name) == test


def unmatched_quick_patterns(items: list[pytest.Item]) -> list[str]:
    """Patterns of QUICK whose module was collected but that match none of its tests (a renamed test)."""
    collected_files = {item.path.name for item in items}
    return [pattern for pattern in QUICK
            if _parse(pattern)[0] in collected_files and not any(_matches(item, pattern) for item in items)]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    for item in gpu_items:
        item.add_marker(pytest.mark.full)
        if any(_matches(item, pattern) for pattern in QUICK):
            item.add_marker(pytest.mark.quick)
    for pattern in unmatched_quick_patterns(gpu_items):
        warnings.warn(pytest.PytestWarning(f"tests/gpu/conftest.py QUICK: {pattern!r} names no collected test"),
                      stacklevel=1)
