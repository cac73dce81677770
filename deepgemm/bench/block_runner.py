"""``deepgemm bench --model``: one transformer block's linear layers as real PyTorch modules, timed per implementation.

Every implementation (``block_impls``) is built from the same seeded random BF16 weights and reads the same inputs
(``block_tensors``). Routing is fixed and balanced (token t's j-th expert is (t * top_k + j) mod E, so each expert
gets tokens * top_k / E rows, as ``deepgemm.analysis`` assumes); the permutation into each implementation's layout is
done once, outside the timed region, and the combine back to token order is not timed. Each implementation's whole
block (its layers in sequence, the activation of each MLP between its two GEMMs, under ``torch.inference_mode``) is
one timed callable, and so is each layer on its own; both are timed interleaved across implementations by
``deepgemm.tuning.timing.bench_gpu_interleaved`` (CUDA-graph replay, L2 flushed before every sample, median).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from deepgemm.analysis.models import ModelSpec
from deepgemm.bench.block_impls import (
    BF16, BLOCKWISE, DEEPGEMM, IMPLEMENTATIONS, BlockImplementation, Step, build_implementations,
)
from deepgemm.bench.block_layers import DECODE_MAX_TOKENS, BlockLayer, BlockPlan, block_plan, is_moe_block
from deepgemm.bench.block_results import BlockResults, LayerResult, Status, Timed, TokenResult
from deepgemm.bench.block_tensors import Routing, make_inputs, make_weights
from deepgemm.bench.peers import Unavailable
from deepgemm.bench.runner import environment as gpu_environment
from deepgemm.errors import UnsupportedError
from deepgemm.tuning.timing import FLUSH_BYTES, FlushMode, Timing, bench_gpu_interleaved
from deepgemm.utils import calc_diff

Progress = Callable[[Sequence[int], str, Callable[[int], str]], Iterator[int]]


@dataclass(frozen=True)
class BlockSettings:
    iters: int = 30
    warmup: int = 5
    flush_l2: bool = True
    flush_mode: FlushMode = "zero"  # how (deepgemm.tuning.timing.FLUSH_MODES)
    use_graph: bool = True
    seed: int = 0
    skip: tuple[str, ...] = ()  # peers left out on request (SKIPPABLE)

    def to_json(self) -> dict[str, Any]:
        return {"iters": self.iters, "warmup": self.warmup, "flush_l2_bytes": FLUSH_BYTES if self.flush_l2 else 0,
                "flush_mode": self.flush_mode, "use_graph": self.use_graph, "seed": self.seed, "skip": list(self.skip),
                "decode_max_tokens": DECODE_MAX_TOKENS}


def run_block_bench(model: ModelSpec, tokens: Sequence[int], settings: BlockSettings, *,
                    device: torch.device | str = "cuda", progress: Progress | None = None,
                    log: Callable[[str], None] | None = None) -> BlockResults:
    """Build the block's modules once per implementation, then at every token count check each layer once (eager,
    which also compiles), time every implementation's block interleaved, then each layer interleaved."""
    say = log or (lambda _: None)
    plans = {count: block_plan(model, count) for count in tokens}
    names = [name for name in IMPLEMENTATIONS if name not in settings.skip]
    left_out = {name: "left out on request (--skip)" for name in IMPLEMENTATIONS if name in settings.skip}
    say(f"building {model.name}'s {'MoE' if is_moe_block(model) else 'dense'} block weights "
        f"(seed {settings.seed}) and the modules of {', '.join(names)}...")
    on_gpu = torch.device(device).type == "cuda"
    # The timer's events, L2 flush and graph capture use the current device: make it the one the tensors are on.
    with torch.cuda.device(device) if on_gpu else contextlib.nullcontext():
        weights = make_weights(model, plans.values(), device, settings.seed)
        implementations = build_implementations(weights, names)
        iterate = progress or (lambda items, _description, _label: iter(items))
        results = []
        for count in iterate(list(plans), "benchmarking", lambda t: f"{t} tokens"):
            results.append(_measure_tokens(plans[count], implementations, settings, device))
            if on_gpu:
                torch.cuda.empty_cache()
        env = gpu_environment() if on_gpu else {"device": str(device), "torch": torch.__version__}
    return BlockResults(model, names, left_out, settings.to_json(), env, results)


def _measure_tokens(plan: BlockPlan, implementations: Sequence[BlockImplementation], settings: BlockSettings,
                    device: torch.device | str) -> TokenResult:
    routing = Routing.build(plan.routing, device) if plan.routing is not None else None
    inputs = make_inputs(plan, device, settings.seed)
    prepared: dict[str, list[Step]] = {}
    checked: dict[str, dict[str, Any]] = {}  # impl -> layer -> output (or Timed for a failure)
    for impl in implementations:
        with torch.inference_mode():
            prepared[impl.name] = impl.steps(plan, routing, inputs)
        checked[impl.name] = _check(impl.name, prepared[impl.name], device)
    diffs = _diffs(prepared, checked)

    block_fns = {name: _block_fn(steps) for name, steps in prepared.items()
                 if not any(isinstance(out, Timed) for out in checked[name].values())}
    block_times = _time_group(block_fns, settings)
    block: dict[str, Timed] = {}
    for impl in implementations:
        failed = [(name, out) for name, out in checked[impl.name].items() if isinstance(out, Timed)]
        if failed:
            status = "error" if any(t.status == "error" for _, t in failed) else failed[0][1].status
            block[impl.name] = Timed(status, reason=f"{failed[0][0]}: {failed[0][1].reason}"
                                     + (f" (and {len(failed) - 1} more layers)" if len(failed) > 1 else ""))
        else:
            block[impl.name] = _timed(impl.name, block_times[impl.name])

    deepgemm = next((impl for impl in implementations if impl.name == DEEPGEMM), None)
    layers = []
    for index, layer in enumerate(plan.layers):
        fns, times = {}, {}
        for impl in implementations:
            out = checked[impl.name][layer.name]
            if isinstance(out, Timed):
                times[impl.name] = out
                continue
            step = prepared[impl.name][index]
            fixed = step.input if layer.source is None else checked[impl.name][f"{layer.source}#input"]
            fns[impl.name] = _layer_fn(step, fixed)
        for name, timing in _time_group(fns, settings).items():
            times[name] = _timed(name, timing, diffs.get((name, layer.name)))
        layers.append(LayerResult(layer, deepgemm.backend(layer) if deepgemm else "-",
                                  {impl.name: times[impl.name] for impl in implementations}))
    return TokenResult(plan.tokens, plan.phase, plan.routing, block, layers)


def _check(name: str, steps: list[Step], device: torch.device | str) -> dict[str, Any]:
    """Run each layer once in block order (eager; this also compiles): its output, or a Timed failure. The output
    of a layer another one reads is also kept, cloned, as that layer's fixed input for its own timing."""
    outputs: dict[str, Any] = {}
    sources = {step.layer.source for step in steps if step.layer.source is not None}
    with torch.inference_mode():
        for step in steps:
            layer = step.layer
            if layer.source is not None and isinstance(outputs.get(layer.source), Timed):
                failed: Timed = outputs[layer.source]
                outputs[layer.name] = Timed(failed.status, reason=f"its input layer {layer.source} did not run")
                continue
            x = step.input if layer.source is None else outputs[layer.source]
            try:
                out = step.fn(x)
                if torch.device(device).type == "cuda":
                    torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - reported per layer, the run goes on
                outputs[layer.name] = _failure(name, exc, layer)
                continue
            outputs[layer.name] = out
            if layer.name in sources:
                outputs[f"{layer.name}#input"] = _clone(out)
    return outputs


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    return [item.clone() for item in value]


def _diffs(prepared: dict[str, list[Step]], checked: dict[str, dict[str, Any]]) -> dict[tuple[str, str], float]:
    """calc_diff of each FP8 implementation's layer outputs (their rows in routing order) against the BF16 one's."""
    if BF16 not in prepared:
        return {}
    diffs: dict[tuple[str, str], float] = {}
    reference_steps = {step.layer.name: step for step in prepared[BF16]}
    with torch.inference_mode():
        for name, steps in prepared.items():
            if name == BF16:
                continue
            for step in steps:
                ours, theirs = checked[name][step.layer.name], checked[BF16][step.layer.name]
                if isinstance(ours, Timed) or isinstance(theirs, Timed):
                    continue
                diffs[(name, step.layer.name)] = calc_diff(step.rows(ours).float(),
                                                           reference_steps[step.layer.name].rows(theirs).float())
    return diffs


def _block_fn(steps: list[Step]) -> Callable[[], Any]:
    def block() -> Any:
        with torch.inference_mode():
            outputs: dict[str, Any] = {}
            for step in steps:
                x = step.input if step.layer.source is None else outputs[step.layer.source]
                outputs[step.layer.name] = step.fn(x)
        return outputs

    return block


def _layer_fn(step: Step, x: Any) -> Callable[[], Any]:
    def layer() -> Any:
        with torch.inference_mode():
            return step.fn(x)

    return layer


def _time_group(fns: dict[str, Callable[[], Any]], settings: BlockSettings) -> dict[str, Timing | BaseException]:
    """Time the callables interleaved (same clock for all); if that fails, each alone, to tell which one fails."""
    if not fns:
        return {}

    def time(group: list[Callable[[], Any]]) -> list[Timing]:
        return bench_gpu_interleaved(group, iters=settings.iters, warmup=settings.warmup, flush_l2=settings.flush_l2,
                                     use_graph=settings.use_graph, flush_mode=settings.flush_mode)

    try:
        return dict(zip(fns, time(list(fns.values()))))
    except Exception:  # noqa: BLE001 - time them one by one
        results: dict[str, Timing | BaseException] = {}
        for name, fn in fns.items():
            try:
                results[name] = time([fn])[0]
            except Exception as exc:  # noqa: BLE001
                results[name] = exc
        return results


def _timed(name: str, timing: Timing | BaseException, diff: float | None = None) -> Timed:
    if isinstance(timing, BaseException):
        return _failure(name, timing)
    return Timed.from_timing(timing, diff)


def _failure(name: str, exc: BaseException, layer: BlockLayer | None = None) -> Timed:
    """deepgemm failing is an "error" (unless it says the shape is unsupported: "n/a"); cuBLAS block-wise raising
    is a refusal; anything else a peer cannot do is "n/a"."""
    text = str(exc).strip().splitlines()
    first = (text[0] if text else "").split(" when calling `")[0]  # cuBLAS: the status, not the call's arguments
    reason = f"{type(exc).__name__}: {first[:160]}"
    if layer is not None:
        reason += f" ({'x'.join(map(str, layer.shape))})"
    status: Status
    if isinstance(exc, (Unavailable, UnsupportedError)):
        status = "n/a"
    elif name == DEEPGEMM:
        status = "error"
    else:
        status = "refused" if name == BLOCKWISE else "n/a"
    return Timed(status, reason=reason)
