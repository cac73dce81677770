"""``deepgemm bench --model``: the results of a run (per token count, per layer, per implementation), the verdicts
drawn from them, and their JSON form (``--json``, format ``deepgemm-bench-block``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from deepgemm.analysis.models import ModelSpec
from deepgemm.bench.block_impls import BF16, DEEPGEMM, IMPLEMENTATIONS
from deepgemm.bench.block_layers import BlockLayer, Phase, RoutingPlan, is_moe_block
from deepgemm.tuning.timing import Timing

FORMAT = "deepgemm-bench-block"
VERSION = 1
# calc_diff of an FP8 layer against the BF16 implementation's output of the same layer: FP8 rounding of both
# operands puts it near 1e-3 (a little more for a down projection, whose input carries its gate/up's error); a layout
# or indexing mistake gives ~1.
DIFF_LIMIT = 1e-2

Status = Literal["ok", "refused", "n/a", "error"]


@dataclass(frozen=True)
class Timed:
    """One implementation's timing of one callable (a block or a layer), or why there is none."""

    status: Status
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    min_us: float | None = None
    samples: int = 0
    cuda_graph: bool | None = None
    calc_diff: float | None = None  # against the BF16 implementation's output of the same layer
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.median_us is not None

    @property
    def accurate(self) -> bool:
        return self.calc_diff is None or self.calc_diff <= DIFF_LIMIT

    @property
    def time_us(self) -> float | None:
        """The median when timed, else None."""
        return self.median_us if self.status == "ok" else None

    @classmethod
    def from_timing(cls, timing: Timing, calc_diff: float | None = None) -> Timed:
        return cls("ok", timing.median_us, timing.p10_us, timing.p90_us, timing.min_us, len(timing.samples_us),
                   timing.graph, calc_diff)

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if value is not None}


@dataclass
class LayerResult:
    layer: BlockLayer
    backend: str  # the path deepgemm's module took: "sm90", "reference" or "bf16" (routed / the router)
    times: dict[str, Timed]

    def to_json(self) -> dict[str, Any]:
        layer = self.layer
        return {"name": layer.name, "category": layer.category, "m": layer.m, "n": layer.n, "k": layer.k,
                "experts": layer.experts, "active_experts": layer.active_experts, "source": layer.source,
                "flops": layer.flops, "backend": self.backend,
                "times": {impl: timed.to_json() for impl, timed in self.times.items()}}


@dataclass
class TokenResult:
    tokens: int
    phase: Phase
    routing: RoutingPlan | None
    block: dict[str, Timed]
    layers: list[LayerResult]

    def _block_us(self, impl: str) -> float | None:
        timed = self.block.get(impl)
        return timed.time_us if timed is not None else None

    def speedup(self, peer: str) -> float | None:
        """deepgemm's speedup over `peer` on the whole block (peer time / deepgemm time)."""
        ours, theirs = self._block_us(DEEPGEMM), self._block_us(peer)
        return theirs / ours if ours and theirs is not None else None

    def tokens_per_s(self, impl: str) -> float | None:
        time_us = self._block_us(impl)
        return self.tokens / (time_us * 1e-6) if time_us else None

    def layer_time_us(self) -> tuple[float, float] | None:
        """(deepgemm's layer time in its own kernels, its total layer time), each the sum of per-layer medians;
        None unless every layer was timed."""
        ours = total = 0.0
        for result in self.layers:
            timed = result.times.get(DEEPGEMM)
            time_us = timed.time_us if timed is not None else None
            if time_us is None:
                return None
            total += time_us
            if result.backend == "sm90":
                ours += time_us
        return ours, total

    def our_kernel_share(self) -> float | None:
        """The fraction of deepgemm's block GEMM time (sum over its layers) spent in layers that ran deepgemm's
        kernels; the rest ran in BF16 (the router, layers Fp8Linear routes to a BF16 matmul)."""
        times = self.layer_time_us()
        return times[0] / times[1] if times and times[1] > 0 else None

    def to_json(self) -> dict[str, Any]:
        routing = None
        if self.routing is not None:
            r = self.routing
            routing = {"experts": r.experts, "top_k": r.top_k, "rows": r.rows, "active_experts": r.active_experts,
                       "rows_per_expert": [min(r.counts), max(r.counts)], "form": r.form,
                       "kernel_rows": r.kernel_rows, "max_m": r.max_m if r.form == "masked" else None,
                       "expected_m": r.expected_m if r.form == "masked" else None,
                       "alignment": r.alignment}
        rates = {impl: self.tokens_per_s(impl) for impl in self.block}
        speedups = {peer: self.speedup(peer) for peer in self.block if peer != DEEPGEMM}
        return {"tokens": self.tokens, "phase": self.phase, "moe": routing,
                "block": {impl: timed.to_json() for impl, timed in self.block.items()},
                "tokens_per_s": {impl: rate for impl, rate in rates.items() if rate},
                "speedup": {peer: value for peer, value in speedups.items() if value is not None},
                "our_kernel_share": self.our_kernel_share(), "layers": [layer.to_json() for layer in self.layers]}


@dataclass
class BlockResults:
    model: ModelSpec
    implementations: list[str]
    left_out: dict[str, str]
    settings: dict[str, Any]
    environment: dict[str, Any]
    results: list[TokenResult]

    @property
    def kind(self) -> str:
        return "MoE" if is_moe_block(self.model) else "dense"

    def problems(self) -> list[str]:
        """Lines naming every layer or block deepgemm failed or was inaccurate on."""
        lines = []
        for result in self.results:
            for layer in result.layers:
                timed = layer.times.get(DEEPGEMM)
                if timed is not None and timed.status == "error":
                    lines.append(f"{result.tokens} tokens, {layer.layer.name}: deepgemm failed: {timed.reason}")
                elif timed is not None and not timed.accurate:
                    lines.append(f"{result.tokens} tokens, {layer.layer.name}: deepgemm calc_diff "
                                 f"{timed.calc_diff:.1e} against {BF16} (limit {DIFF_LIMIT:.0e})")
            block = result.block.get(DEEPGEMM)
            if block is not None and block.status == "error":
                lines.append(f"{result.tokens} tokens: deepgemm's block failed: {block.reason}")
        return lines

    @property
    def exit_code(self) -> int:
        return 1 if self.problems() else 0

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION,
                "model": {"name": self.model.name, "description": self.model.describe(), "block": self.kind},
                "implementations": {name: IMPLEMENTATIONS[name] for name in self.implementations},
                "left_out": self.left_out, "settings": self.settings, "environment": self.environment,
                "results": [result.to_json() for result in self.results]}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
