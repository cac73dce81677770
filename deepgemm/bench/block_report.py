"""Tables of ``deepgemm bench --model``: the block per token count, its layers, and the plan without a GPU.

Every table fits 100 columns (rich's borders included) for the presets' layer names and shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

from deepgemm.api.backend import fp8_linear_route
from deepgemm.bench.block_impls import BF16, BLOCKWISE, DEEPGEMM, IMPLEMENTATIONS
from deepgemm.bench.block_layers import DECODE_MAX_TOKENS, BlockLayer, BlockPlan
from deepgemm.bench.block_results import DIFF_LIMIT, BlockResults, Timed, TokenResult
from deepgemm.bench.console import print_table, say
from deepgemm.bench.suites import format_shape

TARGET_SHARE = 0.90  # issue 24: at least 90 % of the block's GEMM time in deepgemm's own kernels
SHORT_NAMES = {DEEPGEMM: "deepgemm", BF16: "bf16", BLOCKWISE: "cublas-fp8"}
SUMMARY_HEADERS = ("tokens", "implementation", "ms/block", "p10-p90 ms", "tokens/s", "speedup", "% ours")


def block_description(plan: BlockPlan) -> str:
    if plan.routing is not None:
        shared = ", shared experts" if any(layer.category == "shared experts" for layer in plan.layers) else ""
        return f"one MoE layer: attention projections, router (BF16 nn.Linear), routed experts{shared}"
    return "one dense layer: attention projections, gate/up, down"


def header_lines(results: BlockResults, plans: Sequence[BlockPlan]) -> list[str]:
    lines = [f"[bold]{results.model.name}[/bold]: {results.model.describe()}",
             f"block: {block_description(plans[0])}; the attention core, norms, embeddings and LM head are not "
             "timed"]
    lines += [f"  {name}: {IMPLEMENTATIONS[name]}" for name in results.implementations]
    lines += [f"  left out: {name}: {why}" for name, why in results.left_out.items()]
    return lines


def notes(results: BlockResults) -> list[str]:
    moe = any(result.routing is not None for result in results.results)
    lines = [
        f"up to {DECODE_MAX_TOKENS} tokens is a decode step (that many sequences, one new token each); more is a "
        "prefill of one sequence",
        "each layer is timed alone on a fixed input; the block is one callable (its layers in sequence); a down "
        f"projection includes the activation of its gate/up output (torch's act(gate) * up, except {DEEPGEMM}'s "
        "SiLU-gated experts: one pass with the quantization)",
        f"{BLOCKWISE} and {DEEPGEMM} quantize activations with deepgemm.quantize_per_token_group (1x128); cuBLAS "
        "gets the scales re-laid with strides (1, M), a copy when M % 4 != 0",
        f"calc_diff: each FP8 layer's output against {BF16}'s on the same input (FP8 rounding gives ~1e-3; "
        f"flagged above {DIFF_LIMIT:.0e})",
    ]
    if moe:
        lines.insert(1, "routing: fixed and balanced (token t's j-th expert is (t*top_k + j) mod E), permuted into "
                        "each implementation's layout once outside the timed region; the combine is not timed; "
                        "deepgemm's experts use the masked layout for decode (as engines run it under CUDA graphs) "
                        "and the contiguous one for prefill")
    return lines


def summary_rows(results: BlockResults) -> list[list[str]]:
    rows = []
    for result in results.results:
        share = result.our_kernel_share()
        for impl, timed in result.block.items():
            speedup = result.speedup(impl) if impl != DEEPGEMM else None
            rate = result.tokens_per_s(impl)
            rows.append([
                str(result.tokens), impl, _ms(timed), _spread_ms(timed), f"{rate:,.0f}" if rate else "",
                f"{speedup:.2f}x" if speedup is not None else "",
                f"{100 * share:.1f}%" if impl == DEEPGEMM and share is not None else "",
            ])
    return rows


def layer_headers(impls: Sequence[str]) -> list[str]:
    return ["layer", "M x N x K", *(f"{SHORT_NAMES.get(impl, impl)} us" for impl in impls), "backend"]


def layer_rows(result: TokenResult) -> list[list[str]]:
    rows = []
    for layer_result in result.layers:
        layer = layer_result.layer
        cells: list[str] = [layer.label, format_shape(layer.shape)]
        for timed in layer_result.times.values():
            cells.append(_us(timed))
        rows.append(cells + [layer_result.backend])
    return rows


def share_line(result: TokenResult) -> str | None:
    times = result.layer_time_us()
    if times is None:
        return None
    ours, total = times
    share = ours / total if total else 0.0
    routed = [f"{layer.layer.label} ({layer.backend})" for layer in result.layers if layer.backend != "sm90"]
    verdict = "met" if share >= TARGET_SHARE else "NOT met"
    line = (f"{DEEPGEMM}: {100 * share:.1f}% of its block's GEMM time ({total:,.1f} us, the sum of its layers) in "
            f"its own kernels, not routed (target >= {100 * TARGET_SHARE:.0f}%: {verdict})")
    return line + (f"; elsewhere: {', '.join(routed)}" if routed else "")


def refusal_lines(result: TokenResult) -> list[str]:
    lines = []
    for layer in result.layers:
        for impl, timed in layer.times.items():
            if not timed.ok and timed.reason:
                lines.append(f"{result.tokens} tokens, {layer.layer.name}: {impl} {timed.status}: {timed.reason}")
            elif timed.ok and not timed.accurate:
                lines.append(f"{result.tokens} tokens, {layer.layer.name}: {impl} calc_diff {timed.calc_diff:.1e} "
                             f"(above {DIFF_LIMIT:.0e})")
    return lines


def print_results(results: BlockResults, plans: Sequence[BlockPlan]) -> None:
    for line in header_lines(results, plans):
        say(line)
    impls = results.implementations
    for result in results.results:
        say()
        if result.routing is not None:
            say(f"{result.tokens} tokens: {result.routing.describe()}")
        print_table(f"{result.tokens} tokens ({result.phase}): per layer, median us", layer_headers(impls),
                    layer_rows(result), left_columns=(0, 1, 2 + len(impls)))
        share = share_line(result)
        if share:
            say(share)
        for refusal in refusal_lines(result):
            say(refusal)
    say()
    print_table(f"{results.model.name}: one {results.kind} block, per token count", SUMMARY_HEADERS,
                summary_rows(results), left_columns=2,
                caption=f"speedup: {DEEPGEMM}'s over that implementation (its time / {DEEPGEMM}'s); % ours: the "
                        "share of deepgemm's GEMM time in its own kernels")
    for result in results.results:
        for impl, timed in result.block.items():
            if not timed.ok:
                say(f"{result.tokens} tokens: {impl}'s block {timed.status}: {timed.reason}")
    say("notes:")
    for line in notes(results):
        say(f"  - {line}")
    for problem in results.problems():
        say(f"[yellow]{problem}[/yellow]")


def summary_line(results: BlockResults) -> str:
    """One line: the block, and deepgemm's speedup over each peer at each token count."""
    parts = []
    for result in results.results:
        speedups = [f"{result.speedup(peer):.2f}x vs {SHORT_NAMES.get(peer, peer)}" for peer in result.block
                    if peer != DEEPGEMM and result.speedup(peer) is not None]
        parts.append(f"{result.tokens} tokens " + (", ".join(speedups) if speedups else "no speedup"))
    failed = len(results.problems())
    return (f"summary: {results.model.name}, one {results.kind} block: deepgemm {'; '.join(parts)}"
            f"{f'; {failed} problems' if failed else ''}")


def markdown(results: BlockResults) -> str:
    """The run as Markdown: the block, then per token count its layers and the block summary."""
    impls = results.implementations
    lines = [f"# deepgemm block benchmark: {results.model.name}", "", f"- {results.model.describe()}"]
    env = results.environment
    if env:
        lines.append(f"- GPU: {env.get('device', '?')}, torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, "
                     f"deepgemm {env.get('deepgemm', '?')}")
    lines += [f"- {name}: {IMPLEMENTATIONS[name]}" for name in impls]
    lines += [f"- left out: {name}: {why}" for name, why in results.left_out.items()]
    for result in results.results:
        lines += ["", f"## {result.tokens} tokens ({result.phase}): per layer, median us", ""]
        lines += _markdown_table(layer_headers(impls), layer_rows(result), left=2)
        share = share_line(result)
        if share:
            lines += ["", share]
    lines += ["", "## Per token count", ""]
    lines += _markdown_table(SUMMARY_HEADERS, summary_rows(results), left=2)
    problems = results.problems()
    if problems:
        lines += ["", "## Problems", ""] + [f"- {problem}" for problem in problems]
    lines += ["", summary_line(results)]
    return "\n".join(lines) + "\n"


def _markdown_table(headers: Sequence[str], rows: list[list[str]], left: int) -> list[str]:
    return (["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|"]
            + ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows])


# -- without a GPU ------------------------------------------------------------------------------------------------

PLAN_HEADERS = ("layer", "M x N x K", "experts", "GFLOP", "deepgemm path")


def plan_rows(plan: BlockPlan) -> list[list[str]]:
    return [[layer.label, format_shape(layer.shape), _experts_cell(layer), f"{layer.flops / 1e9:,.2f}",
             _path(layer, plan)] for layer in plan.layers]


def _experts_cell(layer: BlockLayer) -> str:
    return f"{layer.active_experts}/{layer.experts}" if layer.experts else ""


def _path(layer: BlockLayer, plan: BlockPlan) -> str:
    if layer.kind == "router":
        return "BF16 nn.Linear (all)"
    if layer.kind == "experts":
        form = plan.routing.form if plan.routing is not None else "contiguous"
        return f"m_grouped_{form}"
    return "Fp8Linear fp8" if fp8_linear_route(layer.n, layer.k) == "fp8" else "Fp8Linear bf16 route"


def print_plan(plans: Sequence[BlockPlan], reason: str) -> None:
    """What would be timed: the block's layers at every token count, and the path deepgemm's modules take."""
    model = plans[0].model
    say(f"[bold]{reason}[/bold]: nothing can be timed here. The block's layers would be:")
    say(f"[bold]{model.name}[/bold]: {model.describe()}")
    say(f"block: {block_description(plans[0])}")
    for plan in plans:
        say()
        if plan.routing is not None:
            say(f"{plan.tokens} tokens: {plan.routing.describe()}")
        print_table(f"{plan.tokens} tokens ({plan.phase})", PLAN_HEADERS, plan_rows(plan), left_columns=(0, 1, 4))
    say("experts: active/all experts; M of the experts' GEMMs is their routed rows (tokens x top-k)")


# -- cells --------------------------------------------------------------------------------------------------------

def _ms(timed: Timed) -> str:
    return f"{timed.median_us / 1e3:.3f}" if timed.ok and timed.median_us is not None else timed.status


def _spread_ms(timed: Timed) -> str:
    if not timed.ok or timed.p10_us is None or timed.p90_us is None:
        return ""
    return f"{timed.p10_us / 1e3:.3f}-{timed.p90_us / 1e3:.3f}"


def _us(timed: Timed) -> str:
    if not timed.ok:
        return timed.status
    cell = f"{timed.median_us:.1f}"
    return cell if timed.accurate else cell + "!"
