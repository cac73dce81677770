"""The BF16 chunked epilogue and the k-grouped build rules on the host (no GPU): which tiles store in column chunks
(wide FP32 tiles whose whole staging buffer would leave fewer than three stages, in 128-byte chunks; BF16 output's
128 x 256 and 128 x 224 for a fourth stage, in 128- and 64-byte chunks), the shared-memory mirror of the kernel's
staging, the rendered template argument, the k-grouped raster band, C = out as its own addend kind, and that a
one-group k-grouped launch never plans split-K (dense decode sizes only)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepgemm.kernels.common.kind import GemmKind
from deepgemm.kernels.sm90_bf16_gemm.config import (bf16_smem_bytes, store_buffer_bytes, store_chunk_columns,
                                                    warpgroup_store_bytes)
from deepgemm.kernels.sm90_bf16_gemm.cost_model import (BF16_CHUNKED_BELOW_STAGES, MIN_STAGES, Bf16Problem,
                                                         choose_config, stages_for, store_n_for, tile_allowed)
from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16Geometry, grouped_spec
from deepgemm.kernels.sm90_bf16_gemm.spec import (ADDEND_FP32, ADDEND_IN_PLACE, ADDEND_NONE, Bf16GemmSpec,
                                                  addend_kind, render_source)

FP32, BF16 = torch.float32, torch.bfloat16


def tn_fp32(m: int, n: int, k: int) -> Bf16Problem:
    return Bf16Problem(m, n, k, True, False, 4, 0, 132)


def test_bf16_output_chunks_only_where_a_fourth_stage_fits() -> None:
    # 128 x 256 BF16: the whole 32 KB-per-warpgroup buffer leaves 3 stages; 64-column chunks leave 4. 128 x 224: 28 KB
    # leave 3; 32-column (64-byte) chunks leave 4.
    chunked = {(bm, bn): store_n_for(bm, bn, 2) for bm in (64, 128) for bn in range(8, 257, 8) if store_n_for(bm, bn, 2)}
    assert chunked == {(128, 256): 64, (128, 224): 32}
    for (block_m, block_n), store_n in chunked.items():
        assert stages_for(block_m, block_n, 2) == BF16_CHUNKED_BELOW_STAGES - 1
        assert stages_for(block_m, block_n, 2, store_n=store_n) == BF16_CHUNKED_BELOW_STAGES
    # Split-K builds keep the whole buffer; so do tiles whose chunks would be narrower than 64 bytes (128 x 240).
    assert store_n_for(128, 256, 2, split_k=True) == 0
    assert store_chunk_columns(240, 2) == 16 and stages_for(128, 240, 2) == 3 and store_n_for(128, 240, 2) == 0
    config = choose_config(Bf16Problem(4096, 4096, 7168, False, False, 2, 0, 132))
    assert (config.block_m, config.block_n, config.store_n, config.num_stages) == (128, 256, 64, 4), config
    config = choose_config(Bf16Problem(1024, 7168, 2048, False, False, 2, 0, 132, 1, m_grouped=True))
    assert (config.block_m, config.block_n, config.store_n, config.num_stages) == (128, 224, 32, 4), config


def test_wide_fp32_tiles_store_in_128_byte_chunks() -> None:
    # 128 x 256 FP32: the whole 64 KB-per-warpgroup buffer leaves 2 stages; chunks of 32 columns leave 4.
    assert stages_for(128, 256, 4) < MIN_STAGES
    assert store_n_for(128, 256, 4) == 32 == store_chunk_columns(256, 4)
    assert stages_for(128, 256, 4, store_n=32) == 4
    assert warpgroup_store_bytes(256, 4, 32) == 2 * store_buffer_bytes(32, 4) == 16384
    assert tile_allowed(tn_fp32(4096, 4096, 4096), 128, 256)
    # Tiles whose whole buffer fits three stages keep it.
    assert store_n_for(128, 192, 4) == 0 and store_n_for(128, 128, 4) == 0
    # A width that is no whole number of 128-byte chunks keeps its buffer and stays out (too few stages).
    assert store_chunk_columns(240, 4) == 16 and store_n_for(128, 240, 4) == 0
    assert not tile_allowed(tn_fp32(4096, 4096, 4096), 128, 240)


def test_chunked_smem_mirror_and_template_argument() -> None:
    config = choose_config(tn_fp32(4096, 4096, 7168))
    assert (config.block_n, config.store_n) == (256, 32) and "store32" in config.label()
    assert config.smem_bytes(4) == bf16_smem_bytes(128, 256, config.num_stages, 4, False, 32)
    assert bf16_smem_bytes(128, 256, 4, 4, False, 32) == 4 * 384 * 128 + 2 * 16384 + 8 * 8
    spec = Bf16GemmSpec(n=4096, k=7168, layout="tn", out_dtype=FP32, addend=ADDEND_NONE, config=config)
    code = render_source(spec).code
    assert "true, 32u>;" in code.replace("\n", " ") or "false, 32u>;" in code.replace("\n", " ")
    # An unchunked build renders the template as before (no trailing argument: its cached kernels stay valid).
    plain = dataclasses.replace(spec, config=dataclasses.replace(config, block_n=128, store_n=0, num_stages=5))
    assert ", 0u>;" not in render_source(plain).code and "32u>;" not in render_source(plain).code


def test_k_grouped_builds_use_the_raster_and_wide_chunked_tiles() -> None:
    spec = grouped_spec(GemmKind.K_GROUPED, Bf16Geometry(7168, 8), 7168, 0, FP32, FP32, 0, 132, True)
    assert (spec.config.block_m, spec.config.block_n, spec.config.store_n) == (128, 256, 32)
    assert spec.config.group_rows == 16  # bands of 16 M-blocks inside each group (was 1: N-block fastest)
    assert spec.addend == ADDEND_IN_PLACE and "c=out" in spec.label()
    loaded = grouped_spec(GemmKind.K_GROUPED, Bf16Geometry(7168, 8), 7168, 0, FP32, FP32, 0, 132)
    assert loaded.addend == ADDEND_FP32 and loaded.config == spec.config
    # Masked and the psum form keep their own walk (no band); the contiguous m_indices form walks bands.
    masked = grouped_spec(GemmKind.GROUPED_MASKED, Bf16Geometry(4 * 256, 4, 256), 4096, 7168, BF16, None, 256, 132)
    assert masked.config.group_rows == 1
    contiguous = grouped_spec(GemmKind.GROUPED_CONTIGUOUS, Bf16Geometry(4 * 8192, 4), 4096, 7168, BF16, None, 0, 132)
    assert contiguous.config.group_rows > 1


@pytest.mark.parametrize("m,n", [(64, 512), (8, 256), (128, 1024)])
def test_one_group_k_grouped_never_plans_split_k(m: int, n: int) -> None:
    """A k-grouped launch of one group with few tiles looked like a dense decode GEMM to the split-K rule, whose
    split build the k-grouped spec refuses (it raised ValueError)."""
    spec = grouped_spec(GemmKind.K_GROUPED, Bf16Geometry(m, 1), n, 0, FP32, None, 0, 132)
    assert not spec.config.split_k


@pytest.mark.parametrize("kind", [GemmKind.GROUPED_CONTIGUOUS, GemmKind.GROUPED_CONTIGUOUS_PSUM,
                                  GemmKind.GROUPED_MASKED])
@pytest.mark.parametrize("rows,n,k", [(128, 256, 7168), (64, 2112, 7168), (1, 512, 4096), (128, 4096, 16384)])
def test_one_group_m_grouped_never_plans_split_k(kind: GemmKind, rows: int, n: int, k: int) -> None:
    """The same for one expert of an M-grouped launch at decode sizes: every such call raised ValueError ("split-K
    is for dense BF16 GEMMs") while planning, on the kernel path."""
    masked = kind == GemmKind.GROUPED_MASKED
    geometry = Bf16Geometry(rows, 1, rows) if masked else Bf16Geometry(rows, 1)
    spec = grouped_spec(kind, geometry, n, k, BF16, None, rows if masked else 0, 132)
    assert not spec.config.split_k


def test_in_place_addend_kind_is_fp32_only() -> None:
    assert addend_kind(FP32, in_place=True) == ADDEND_IN_PLACE
    assert addend_kind(FP32) == ADDEND_FP32 and addend_kind(None, in_place=True) == ADDEND_NONE
    assert addend_kind(BF16, in_place=True) != ADDEND_IN_PLACE  # a BF16 C is loaded: one rounding, in FP32
    config = choose_config(Bf16Problem(256, 256, 256, False, False, 2, 2, 132))
    with pytest.raises(ValueError, match="FP32"):
        Bf16GemmSpec(n=256, k=256, layout="nt", out_dtype=BF16, addend=ADDEND_IN_PLACE, config=config)
