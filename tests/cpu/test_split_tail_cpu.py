"""Split tail on CPU: sm_90a builds of the split-tail kernels, config labels and the opt-in."""

from __future__ import annotations

import pytest
import torch

from deepgemm.configs.heuristics import make_config
from deepgemm.kernels.fp8_gemm import Fp8GemmSpec, compile_spec, plan_spec


@pytest.mark.parametrize("m,n,k,block_m,block_n,out_dtype", [
    (4096, 2112, 7168, 128, 128, torch.bfloat16),
    (4096, 2112, 7168, 256, 128, torch.bfloat16),
    (1000, 2056, 7296, 128, 104, torch.float32),
    (129, 7168, 2048, 64, 112, torch.bfloat16),
])
def test_split_tail_kernels_build_without_spills(m: int, n: int, k: int, block_m: int, block_n: int,
                                                 out_dtype: torch.dtype) -> None:
    config = make_config(m, n, k, block_m, block_n, 132, 4 if out_dtype == torch.float32 else 2, cluster_m=1,
                         split_tail=True)
    assert config.label().endswith(" sk1")
    compiled = compile_spec(Fp8GemmSpec(n, k, out_dtype, config))
    assert compiled.resources is not None
    assert (compiled.resources.spill_stores, compiled.resources.stack_frame) == (0, 0)


def test_split_tail_is_opt_in_except_for_block_m_192(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEEPGEMM_SPLIT_TAIL", raising=False)
    monkeypatch.delenv("DEEPGEMM_CLUSTER_M", raising=False)
    plain = plan_spec(4096, 7168, 16384, torch.bfloat16, 132).config
    assert plain.block_m == 256 and not plain.split_tail
    assert plan_spec(768, 3072, 7168, torch.bfloat16, 132).config.split_tail  # block_m 192: the model's choice
    monkeypatch.setenv("DEEPGEMM_SPLIT_TAIL", "1")
    assert plan_spec(4096, 7168, 16384, torch.bfloat16, 132).config.split_tail


def test_block_m_192_split_tail_only_with_long_ranges() -> None:
    from deepgemm.configs.heuristics import choose_fp8_gemm_config, split_tail_for, split_tail_ranges

    assert split_tail_ranges(544, 132, 56) == 8 and split_tail_ranges(374, 132, 56) == 1
    assert split_tail_ranges(176, 132, 12) == 3 and split_tail_ranges(132, 132, 56) == 1
    assert split_tail_ranges(133, 132, 2) == 2  # at most one range per K block
    assert split_tail_for(192, 374, 132, 56)  # nothing splits: the split-tail build only
    assert split_tail_for(192, 176, 132, 56)  # 3 ranges of >= 18 K blocks
    assert not split_tail_for(192, 176, 132, 12)  # 3 ranges of 4 K blocks: short ranges measured slower
    assert not split_tail_for(256, 374, 132, 56) and not split_tail_for(128, 544, 132, 56)
    assert choose_fp8_gemm_config(768, 3072, 7168, 132).split_tail
