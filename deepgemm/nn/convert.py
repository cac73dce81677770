"""`convert(model)`: replace a model's nn.Linear layers by Fp8Linear, reporting what was replaced and what was left."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from deepgemm.api.backend import fp8_linear_route
from deepgemm.api.quant import INPUT_DTYPES
from deepgemm.nn.linear import OUT_DTYPES, Fp8Linear
from deepgemm.nn.training import Fp8TrainingLinear
from deepgemm.ops.fp8_linear import ALIGNMENT

Selector = Iterable[str] | Callable[[str, nn.Module], bool] | None


@dataclass(frozen=True)
class ConvertedLayer:
    name: str
    out_features: int
    in_features: int


@dataclass(frozen=True)
class LeftLayer:
    name: str
    reason: str


@dataclass
class ConversionReport:
    """What `convert` did: the layers it replaced and those it left as they were, with the reason.

    `replaced`: (name, out_features, in_features) of each new Fp8Linear; `left`: (name, reason) of each nn.Linear
    kept. str() gives a summary line and one line per layer left.

    Returned by:
        deepgemm.convert.

    Example::

        report: deepgemm.nn.ConversionReport = deepgemm.convert(model, exclude=["lm_head"])
        print(report)                      # e.g. "converted 2 linear layer(s) to Fp8Linear, left 1" + the reasons
        names = [layer.name for layer in report.replaced]
    """

    replaced: list[ConvertedLayer] = field(default_factory=list)
    left: list[LeftLayer] = field(default_factory=list)
    target: str = "Fp8Linear"  # the class the replaced layers became (Fp8TrainingLinear with training=True)

    def __str__(self) -> str:
        lines = [f"converted {len(self.replaced)} linear layer(s) to {self.target}, left {len(self.left)}"]
        lines += [f"  left {layer.name}: {layer.reason}" for layer in self.left]
        return "\n".join(lines)


def _selected(selector: Selector, name: str, module: nn.Module) -> bool:
    if callable(selector):
        return bool(selector(name, module))
    patterns = [selector] if isinstance(selector, str) else list(selector or ())
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _reason_to_leave(name: str, module: nn.Linear, parent: nn.Module, include: Selector, exclude: Selector,
                     training: bool) -> str | None:
    if include is not None and not _selected(include, name, module):
        return "not matched by include"
    if exclude is not None and _selected(exclude, name, module):
        return "matched by exclude"
    if type(module) is not nn.Linear:
        return f"{type(module).__name__} subclasses nn.Linear (its forward may differ)"
    if isinstance(parent, nn.MultiheadAttention):
        return "nn.MultiheadAttention reads this weight directly"
    weight = module.weight
    if weight.device.type == "meta" and not training:
        return "weight is on the meta device (load an FP8 checkpoint with load_fp8_checkpoint instead)"
    if weight.dtype not in INPUT_DTYPES:
        return f"weight dtype {weight.dtype} is not a 16/32-bit float"
    if training and module.out_features % ALIGNMENT:
        return (f"kept in {weight.dtype} (out_features % {ALIGNMENT} != 0: the Dgrad GEMM's reduction dimension "
                "must be whole 16-byte rows)")
    if fp8_linear_route(module.out_features, module.in_features) == "bf16":
        rule = "in_features % 16 != 0" if module.in_features % 16 else "weight too small to gain from FP8"
        return f"kept in {weight.dtype} ({rule}: the FP8 kernel would not be the faster correct path)"
    return None


def convert(model: nn.Module, *, include: Selector = None, exclude: Selector = None,
            dtype: torch.dtype | None = None, training: bool = False) -> ConversionReport:
    """Replace, in place, every nn.Linear of `model` that FP8 serves well by an Fp8Linear (weights quantized per
    128x128 block on their device), or with training=True by an Fp8TrainingLinear (the layer's own parameters,
    trained through FP8 Fprop, Dgrad and Wgrad GEMMs; optimizers built before keep working).

    include / exclude: glob patterns on qualified module names (e.g. exclude=["lm_head", "*.gate"]) or a callable
    (name, module) -> bool. dtype: the Fp8Linear output dtype (default: the layer's own when bfloat16/float32, else
    bfloat16). Layers left alone keep running as they were, on a correct path; the report says why for each.

    Left alone: layers not matched by `include` or matched by `exclude`, nn.Linear subclasses, the projections of
    nn.MultiheadAttention, weights on the meta device or not 16/32-bit floats, and shapes `fp8_linear_route`
    sends to a BF16 matmul (in_features % 16 != 0, weights under 2048 x 4096 elements). With training=True also
    out_features % 16 != 0 (Dgrad's reduction dimension); weights on the meta device are converted (the layer holds
    the same Parameter objects, so materializing them later, e.g. with to_empty, works as for nn.Linear).

    Args:
        model: the nn.Module to convert in place (a root that is itself an nn.Linear is left: use
            Fp8Linear.from_linear).
        include / exclude: see above (None: every layer / none).
        dtype: see above (inference only: a training layer computes in its input's dtype).
        training: convert to Fp8TrainingLinear (differentiable, BF16/FP32 master weights) instead of Fp8Linear.

    Returns:
        A ConversionReport.

    Raises:
        TypeError: `dtype` is not bfloat16/float32.
        ValueError: `dtype` given with training=True.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError: the GPU quantizer could not be
            compiled or loaded (weights on an sm_90 GPU). Every layer is quantized before any is replaced, so
            after an error the model is as it was.

    Example::

        model = torch.nn.Sequential(torch.nn.Linear(4096, 14336), torch.nn.SiLU(),
                                    torch.nn.Linear(14336, 4096)).to("cuda", torch.bfloat16)
        print(deepgemm.convert(model, exclude=["lm_head", "*.gate"]))
    """
    if dtype is not None and dtype not in OUT_DTYPES:
        raise TypeError(f"convert: 'dtype' must be torch.bfloat16 or torch.float32, got {dtype}")
    if training and dtype is not None:
        raise ValueError("convert: 'dtype' sets Fp8Linear's output dtype; with training=True each layer computes in "
                         "its input's dtype (leave dtype=None)")
    report = ConversionReport(target="Fp8TrainingLinear" if training else "Fp8Linear")
    parents = {name: module for name, module in model.named_modules()}
    targets: list[tuple[str, nn.Module, str, nn.Linear]] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if not name:
            report.left.append(LeftLayer("(root)", "the model itself is the layer: use Fp8Linear.from_linear"))
            continue
        parent_name, _, attribute = name.rpartition(".")
        parent = parents[parent_name]
        reason = _reason_to_leave(name, module, parent, include, exclude, training)
        if reason is not None:
            report.left.append(LeftLayer(name, reason))
        else:
            targets.append((name, parent, attribute, module))
    # Every layer is quantized before any is replaced: an error leaves the model as it was.
    converted: list[nn.Module] = [Fp8TrainingLinear.from_linear(module) if training
                                  else Fp8Linear.from_linear(module, dtype=dtype) for _, _, _, module in targets]
    for (name, parent, attribute, module), layer in zip(targets, converted, strict=True):
        setattr(parent, attribute, layer)
        report.replaced.append(ConvertedLayer(name, module.out_features, module.in_features))
    return report
