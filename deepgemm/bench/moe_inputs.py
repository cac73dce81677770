"""Random operands of one MoE grouped case on the GPU (FP8 with deepgemm's scales) and its float64 reference."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepgemm.analysis.gpus import Precision
from deepgemm.api.quant import quantize_per_block, quantize_per_token_group
from deepgemm.bench.inputs import GROUP, dequantize
from deepgemm.bench.moe_cases import MoeCase
from deepgemm.bench.suites import Shape


@dataclass
class MoeProblem:
    """One case's operands. Contiguous: A [rows, K] (rows: every segment padded to 128) with ``m_indices``;
    masked: A [G, max_m, K] with ``masked_m``; B [G, N, K] with 128 x 128 scales per expert. ``valid_rows`` selects
    the output rows a call defines, in the order of :meth:`reference`."""

    case: MoeCase
    a: tuple[Any, Any]
    b: tuple[Any, Any]
    grouping: Any  # m_indices (contiguous) or masked_m (masked), int32 on the device
    valid_rows: Any  # bool mask over the output's rows (contiguous [rows], masked [G, max_m])
    _exact_a: Any = field(repr=False)  # float64 A values the FP8 operands stand for, valid rows in order
    _exact_b: Any = field(repr=False)
    _row_groups: list[tuple[int, int, int]] = field(repr=False)  # (group, first row in _exact_a, rows)
    precision: Precision = "fp8"
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def m(self) -> int:
        return self.case.valid_rows

    @property
    def n(self) -> int:
        return self.case.n

    @property
    def k(self) -> int:
        return self.case.k

    @property
    def shape(self) -> Shape:
        return self.case.shape

    @property
    def label(self) -> str:
        return self.case.label

    def output(self) -> Any:
        import torch

        rows = (self.case.groups, self.case.max_m) if self.case.kind == "masked" else (len(self.case.m_indices()),)
        # NaN-poisoned: a valid row the call leaves unwritten fails the accuracy check.
        return torch.full((*rows, self.n), float("nan"), dtype=torch.bfloat16, device=self.a[0].device)

    def reference(self) -> Any:
        """float64 [valid rows, N]: every expert's rows times its own weights."""
        if "ref" not in self._cache:
            import torch

            parts = [self._exact_a[first:first + rows] @ self._exact_b[group].t()
                     for group, first, rows in self._row_groups]
            self._cache["ref"] = torch.cat(parts)
        return self._cache["ref"]


def make_moe_problem(case: MoeCase, *, device: Any, seed: int = 0) -> MoeProblem:
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    groups, n, k = case.groups, case.n, case.k
    if case.kind == "contiguous":
        m_indices = torch.tensor(case.m_indices(), dtype=torch.int32, device=device)
        rows = m_indices.numel()
    else:
        rows = groups * case.max_m
    x = torch.randn((rows, k), generator=generator, device=device, dtype=torch.float32)
    w = torch.randn((groups, n, k), generator=generator, device=device, dtype=torch.float32)
    a_fp8, sfa = quantize_per_token_group(x, GROUP)
    weights = [quantize_per_block(w[g], GROUP) for g in range(groups)]
    b = (torch.stack([q for q, _ in weights]), torch.stack([s for _, s in weights]))
    exact_b = torch.stack([dequantize(q, s, GROUP, GROUP) for q, s in weights])
    exact_a_all = dequantize(a_fp8, sfa, GROUP, 1)
    if case.kind == "contiguous":
        valid = m_indices >= 0
        grouping: Any = m_indices
        a: tuple[Any, Any] = (a_fp8, sfa)
        exact_a = exact_a_all[valid]
    else:
        masked_m = torch.tensor(case.counts, dtype=torch.int32, device=device)
        valid = torch.arange(case.max_m, device=device)[None, :] < masked_m[:, None]
        grouping = masked_m
        # One [G * max_m, K] quantization viewed per group, as quantize_per_token_group hands it to a masked GEMM.
        a = (a_fp8.view(groups, case.max_m, k), sfa.reshape(groups, case.max_m, -1))
        exact_a = exact_a_all.view(groups, case.max_m, k)[valid]
    row_groups, first = [], 0
    for group, count in enumerate(case.counts):
        row_groups.append((group, first, count))
        first += count
    return MoeProblem(case, a, b, grouping, valid, exact_a, exact_b, row_groups)
