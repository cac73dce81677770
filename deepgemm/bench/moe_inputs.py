"""Random operands of one MoE grouped case on the GPU (FP8 with deepgemm's scales, or BF16) and its float64
reference."""

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
    masked: A [G, max_m, K] with ``masked_m``; B [G, N, K]. FP8: A and B are (payload, scales) pairs, 1 x 128 and
    128 x 128 per expert; BF16: tensors. ``valid_rows`` selects the output rows a call defines, in the order of
    :meth:`reference`. k-grouped: ``grouping`` the tokens per expert (host ints), ``addend`` the FP32 [G, M, N]
    values ``out`` holds before a call (C = out); BF16 A [K_total, M] and B [K_total, N] token-major, FP8 A
    [M, K_total] and B [N, K_total] with 1 x 128 scales along the tokens (quantize_per_token_group of dY^T, X^T)."""

    case: MoeCase
    a: Any
    b: Any
    grouping: Any  # m_indices (contiguous) or masked_m (masked), int32 on the device; k-grouped: ks, host ints
    valid_rows: Any  # bool mask over the output's rows (contiguous [rows], masked [G, max_m]); k-grouped: None
    _exact_a: Any = field(repr=False)  # float64 A values the operands stand for, valid rows in order
    # float64 B: k-grouped [N, K_total]; m-grouped a function of the expert giving its [N, K], made on demand (all
    # experts at once would take 30 GB for 256 x 2048 x 7168)
    _exact_b: Any = field(repr=False)
    _row_groups: list[tuple[int, int, int]] = field(repr=False)  # (group, first row in _exact_a, rows)
    precision: Precision = "fp8"
    addend: Any = None
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

    @property
    def device(self) -> Any:
        return self.grouping.device if self.case.kind != "k-grouped" else self.addend.device

    def output(self) -> Any:
        """A fresh output: BF16 poisoned with NaN (a valid row the call leaves unwritten fails the accuracy check);
        k-grouped: FP32 holding the addend, which the call adds into."""
        import torch

        if self.case.kind == "k-grouped":
            return self.addend.clone()
        rows = (self.case.groups, self.case.max_m) if self.case.kind == "masked" else (len(self.case.m_indices()),)
        return torch.full((*rows, self.n), float("nan"), dtype=torch.bfloat16, device=self.device)

    def reference(self) -> Any:
        """float64: every expert's rows times its own weights, [valid rows, N]; k-grouped: out after one call,
        [G, M, N] = addend + each expert's A_g^T B_g."""
        if "ref" not in self._cache:
            if self.case.kind == "k-grouped":
                self._cache["ref"] = self.addend.double() + self.product_reference()
            else:
                import torch

                parts = [self._exact_a[first:first + rows] @ self.expert_weights(group).t()
                         for group, first, rows in self._row_groups]
                self._cache["ref"] = torch.cat(parts)
        return self._cache["ref"]

    def expert_weights(self, group: int) -> Any:
        """m-grouped: float64 [N, K] of the values expert `group`'s weights stand for."""
        return self._exact_b(group)

    def segments(self) -> list[tuple[int, int]]:
        """(first, count) of each expert's valid rows (k-grouped: tokens), back to back without padding."""
        return [(first, rows) for _, first, rows in self._row_groups]

    def product_reference(self) -> Any:
        """k-grouped: float64 [G, M, N] of each expert's A_g^T B_g alone (what an implementation without C writes)."""
        if "product" not in self._cache:
            import torch

            if self.precision == "bf16":
                products = [self.a[first:first + tokens].double().t() @ self.b[first:first + tokens].double()
                            for _, first, tokens in self._row_groups]
            else:
                products = [self._exact_a[:, first:first + tokens] @ self._exact_b[:, first:first + tokens].t()
                            for _, first, tokens in self._row_groups]
            self._cache["product"] = torch.stack(products)
        return self._cache["product"]


def _row_groups(counts: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(group, first row, rows) of back-to-back segments."""
    groups, first = [], 0
    for group, count in enumerate(counts):
        groups.append((group, first, count))
        first += count
    return groups


def make_moe_problem(case: MoeCase, *, device: Any, seed: int = 0, precision: Precision = "fp8") -> MoeProblem:
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    if case.kind == "k-grouped":
        return _k_grouped_problem(case, device, generator, precision)
    groups, n, k = case.groups, case.n, case.k
    if case.kind == "contiguous":
        m_indices = torch.tensor(case.m_indices(), dtype=torch.int32, device=device)
        rows = m_indices.numel()
    else:
        rows = groups * case.max_m
    x = torch.randn((rows, k), generator=generator, device=device, dtype=torch.float32)
    w = torch.randn((groups, n, k), generator=generator, device=device, dtype=torch.float32)
    if precision == "bf16":
        a_bf16, b_bf16 = x.bfloat16(), w.bfloat16()
        del x, w

        def bf16_weights(group: int) -> Any:
            return b_bf16[group].double()

        if case.kind == "contiguous":
            valid = m_indices >= 0
            return MoeProblem(case, a_bf16, b_bf16, m_indices, valid, a_bf16[valid].double(), bf16_weights,
                              _row_groups(case.counts), "bf16")
        masked_m = torch.tensor(case.counts, dtype=torch.int32, device=device)
        valid = torch.arange(case.max_m, device=device)[None, :] < masked_m[:, None]
        a_bf16 = a_bf16.view(groups, case.max_m, k)
        return MoeProblem(case, a_bf16, b_bf16, masked_m, valid, a_bf16[valid].double(), bf16_weights,
                          _row_groups(case.counts), "bf16")
    a_fp8, sfa = quantize_per_token_group(x, GROUP)
    weights = [quantize_per_block(w[g], GROUP) for g in range(groups)]
    del x, w
    b = (torch.stack([q for q, _ in weights]), torch.stack([s for _, s in weights]))
    del weights

    def fp8_weights(group: int) -> Any:
        return dequantize(b[0][group], b[1][group], GROUP, GROUP)

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
    return MoeProblem(case, a, b, grouping, valid, exact_a, fp8_weights, _row_groups(case.counts))


def _k_grouped_problem(case: MoeCase, device: Any, generator: Any, precision: Precision) -> MoeProblem:
    """dY [K_total, M] and X [K_total, N] token-major (BF16, or quantized per 1 x 128 token group after a transpose,
    as FP8 Wgrad takes them), and an FP32 addend of the products' magnitude (so a call that drops C misses by as much
    as one that drops the product)."""
    import torch

    dy = torch.randn((case.k, case.m), generator=generator, device=device, dtype=torch.float32)
    x = torch.randn((case.k, case.n), generator=generator, device=device, dtype=torch.float32)
    addend = torch.randn((case.groups, case.m, case.n), generator=generator, device=device, dtype=torch.float32)
    addend.mul_(float(case.expected_m) ** 0.5)
    ks, segments = list(case.counts), _row_groups(case.counts)
    if precision == "bf16":
        return MoeProblem(case, dy.bfloat16(), x.bfloat16(), ks, None, None, None, segments, "bf16", addend)
    a = quantize_per_token_group(dy.t(), GROUP)  # [M, K_total]: scales per row and 128 tokens
    b = quantize_per_token_group(x.t(), GROUP)
    exact_a, exact_b = dequantize(*a, GROUP, 1), dequantize(*b, GROUP, 1)
    return MoeProblem(case, a, b, ks, None, exact_a, exact_b, segments, "fp8", addend)
