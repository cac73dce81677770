"""`load_fp8_checkpoint` / `save_fp8_checkpoint`: FP8 checkpoints in the DeepSeek-V3/R1 and Qwen3-FP8 format.

The format: safetensors files where each quantized linear layer `<prefix>` stores `<prefix>.weight` e4m3 [N, K] and
`<prefix>.weight_scale_inv` (float32 or bfloat16) [ceil(N/128), ceil(K/128)], the real weight being weight *
scale_inv per 128x128 block; every other tensor is stored as it is. Big models are sharded: a folder with
`model.safetensors.index.json` ({"metadata": {...}, "weight_map": {tensor name: file name}}) and its files.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from deepgemm.nn.linear import BLOCK, OUT_DTYPES, Fp8Linear
from deepgemm.ops import quantize_per_block
from deepgemm.utils import ceil_div

INDEX = "model.safetensors.index.json"
SCALE_SUFFIX = "_scale_inv"
SHOWN = 8  # names an error or a summary lists before "(+N more)"
# safetensors dtype strings of float tensors a high-precision tensor or a block scale may have.
FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
E4M3 = "F8_E4M3"
# safetensors dtype strings of FP8 tensors, as torch dtypes: an FP8 tensor loads only into its own format.
_FP8_FORMATS = {E4M3: torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


@dataclass
class LoadReport:
    """What `load_fp8_checkpoint` did. `fp8_layers`: the Fp8Linear layers loaded from FP8 weights and their block
    scales, the converted ones included; `converted`: the nn.Linear layers replaced by an Fp8Linear to hold them;
    `quantized`: Fp8Linear layers whose checkpoint weight was high precision (quantized per 128x128 block at load);
    `tensors`: the other tensors copied; `missing` / `unexpected`: model tensors absent from the checkpoint and
    checkpoint tensors the model has no place for (an error unless strict=False); `on_meta`: model tensors still
    on the meta device after the load (the missing ones, and non-persistent buffers such as rotary `inv_freq`, which
    no checkpoint holds: compute them again); `files`: the files read; `bytes_read`, `seconds`. str() gives a
    summary line and the missing, unexpected and still-on-meta names.

    Returned by:
        deepgemm.nn.load_fp8_checkpoint and deepgemm.distributed.shard_fp8_checkpoint.

    Example::

        from deepgemm.nn import LoadReport, load_fp8_checkpoint

        report: LoadReport = load_fp8_checkpoint(model, "/models/DeepSeek-V3", strict=False)
        print(report)
        assert not report.missing, report.missing
    """

    fp8_layers: list[str] = field(default_factory=list)
    converted: list[str] = field(default_factory=list)
    quantized: list[str] = field(default_factory=list)
    tensors: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    on_meta: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    bytes_read: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        extra = f", {len(self.quantized)} quantized at load" if self.quantized else ""
        lines = [f"loaded {len(self.fp8_layers)} FP8 layer(s) ({len(self.converted)} converted from nn.Linear{extra}) "
                 f"and {len(self.tensors)} other tensor(s) from {len(self.files)} file(s): "
                 f"{self.bytes_read / 2**20:.1f} MiB in {self.seconds:.2f} s"]
        for what, names in (("missing", self.missing), ("unexpected", self.unexpected),
                            ("still on the meta device", self.on_meta)):
            if names:
                lines.append(f"  {what}: {_listing(names)}")
        return "\n".join(lines)


def _listing(names: list[str]) -> str:
    more = f" (+{len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return f"{len(names)} key(s): " + ", ".join(names[:SHOWN]) + more


def _safetensors() -> Any:
    try:
        import safetensors
    except ImportError as error:
        raise ImportError("deepgemm: reading or writing safetensors checkpoints needs the safetensors package: "
                          "pip install deepgemm[hf]") from error
    return safetensors


# ---------------------------------------------------------------------------------------------------- the files

def _checkpoint_files(path: Path) -> tuple[list[Path], dict[str, int] | None]:
    """The files to read and, from an index, which file holds each tensor (name -> position in the list)."""
    if path.is_file():
        return [path], None
    if not path.is_dir():
        raise FileNotFoundError(f"load_fp8_checkpoint: {path} is neither a .safetensors file nor a folder")
    index = path / INDEX
    if not index.is_file():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"load_fp8_checkpoint: {path} holds no {INDEX} and no *.safetensors file")
        return files, None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("'weight_map' is not an object")
        bad = [value for value in weight_map.values() if not isinstance(value, str)]
        if bad:
            raise TypeError(f"'weight_map' values must be file names, got {bad[0]!r}")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"load_fp8_checkpoint: cannot read the weight map of {index}: {error!r}") from error
    names = sorted(set(weight_map.values()))
    outside = [name for name in names if Path(name).name != name]
    if outside:
        raise ValueError(f"load_fp8_checkpoint: {index} names {outside[0]!r}, not a file of {path} (the index "
                         "names the folder's own files)")
    files = [path / name for name in names]
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"load_fp8_checkpoint: {index} names {file.name}, which is not in {path}")
    position = {name: i for i, name in enumerate(names)}
    return files, {tensor: position[name] for tensor, name in weight_map.items()}


def _check_quantization_config(folder: str | os.PathLike[str]) -> None:
    """Refuse a folder whose config.json describes a quantization other than FP8 e4m3 with 128x128 block scales."""
    config_path = Path(folder) / "config.json"
    if not config_path.is_file():
        return
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"load_fp8_checkpoint: cannot read {config_path}: {error!r}") from error
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if quant is None:
        return
    where = f"load_fp8_checkpoint: {config_path} 'quantization_config'"
    if not isinstance(quant, dict):
        raise ValueError(f"{where} must be an object, got {quant!r}")
    if quant.get("quant_method", "fp8") != "fp8":
        raise ValueError(f"{where} has quant_method {quant['quant_method']!r}: only 'fp8' checkpoints (e4m3 weights "
                         f"with {BLOCK}x{BLOCK} block scales, the DeepSeek-V3 / Qwen3-FP8 format) load")
    block = quant.get("weight_block_size", [BLOCK, BLOCK])
    if not isinstance(block, (list, tuple)) or [*block] != [BLOCK, BLOCK]:
        raise ValueError(f"{where} has weight_block_size {block!r}: Fp8Linear takes {BLOCK}x{BLOCK} block scales "
                         f"only ([{BLOCK}, {BLOCK}])")
    if quant.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"{where} has fmt {quant['fmt']!r}: Fp8Linear takes e4m3 weights only")


class _Checkpoint:
    """The checkpoint's tensors by name, read lazily: each file opened once, closed after its last read."""

    def __init__(self, files: list[Path], weight_map: dict[str, int] | None) -> None:
        safe_open = _safetensors().safe_open
        self.files = files
        self.handles: list[Any] = []
        self.where: dict[str, int] = {}
        self.read_files: set[int] = set()
        self.bytes_read = 0
        try:
            for i, file in enumerate(files):
                if not file.is_file():  # (a folder or a FIFO named *.safetensors)
                    raise ValueError(f"load_fp8_checkpoint: {file} is not a regular file")
                try:
                    handle = safe_open(str(file), framework="pt", device="cpu")
                    self.handles.append(handle.__enter__())
                    names = list(handle.keys())
                except OSError:
                    raise
                except Exception as error:  # safetensors' own error type: a malformed header or layout
                    raise ValueError(f"load_fp8_checkpoint: {file} is not a readable safetensors file: "
                                     f"{error}") from error
                for name in names:
                    if weight_map is not None:
                        if weight_map.get(name) == i:
                            self.where[name] = i
                    elif name in self.where:
                        raise ValueError(f"load_fp8_checkpoint: tensor {name!r} is in both "
                                         f"{files[self.where[name]].name} and {file.name}")
                    else:
                        self.where[name] = i
            if weight_map is not None:
                absent = sorted(set(weight_map) - set(self.where))
                if absent:
                    raise ValueError(f"load_fp8_checkpoint: tensors of the index are not in the files it names: "
                                     f"{_listing(absent)}")
        except BaseException:
            self.close()
            raise

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def meta(self, name: str) -> tuple[str, tuple[int, ...]]:
        """(safetensors dtype string, shape), read from the file's header."""
        with self._errors(name):
            tensor_slice = self.handles[self.where[name]].get_slice(name)
            return str(tensor_slice.get_dtype()), tuple(int(d) for d in tensor_slice.get_shape())

    def read(self, name: str) -> torch.Tensor:
        """The tensor; on CPU it may be a view of the file's mapping (copy it before keeping it)."""
        i = self.where[name]
        with self._errors(name):
            tensor: torch.Tensor = self.handles[i].get_tensor(name)
        self.read_files.add(i)
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    @contextmanager
    def _errors(self, name: str) -> Iterator[None]:
        """safetensors' own errors (a damaged file) as a ValueError naming the file and the tensor."""
        try:
            yield
        except (OSError, ValueError, KeyError):
            raise
        except Exception as error:
            file = self.files[self.where[name]]
            raise ValueError(f"load_fp8_checkpoint: cannot read tensor {name!r} of {file}: {error}") from error

    def release(self, i: int) -> None:
        handle, self.handles[i] = self.handles[i], None
        if handle is not None:
            handle.__exit__(None, None, None)

    def close(self) -> None:
        for i in range(len(self.handles)):
            self.release(i)


# ---------------------------------------------------------------------------------------------------- the plan

Owner = tuple[nn.Module, str]  # (parent module, attribute)


@dataclass
class _Layer:
    """An FP8 layer to load: an Fp8Linear ('load' / 'quantize') or an nn.Linear to replace ('convert')."""

    prefix: str  # the checkpoint key prefix ("" for the model itself)
    module: nn.Module
    owners: list[Owner]
    kind: Literal["load", "convert", "quantize"]
    keys: list[str]  # weight, [scale_inv], [bias]: the checkpoint tensors it reads
    has_bias: bool


@dataclass
class _Slot:
    """One other model tensor (a parameter or a persistent buffer), with the names it goes by when tied."""

    names: list[str]
    owners: list[Owner]
    tensor: torch.Tensor
    is_parameter: bool
    key: str | None = None


def _key(prefix: str, attribute: str) -> str:
    return f"{prefix}.{attribute}" if prefix else attribute


def _check_same_tensor(key: str, other: str, ckpt: _Checkpoint, where: str = "load_fp8_checkpoint") -> None:
    """A tied tensor stored under two names loads once, so both copies must hold the same bytes."""
    if ckpt.meta(key) != ckpt.meta(other) or not torch.equal(ckpt.read(key).reshape(-1).view(torch.uint8),
                                                             ckpt.read(other).reshape(-1).view(torch.uint8)):
        raise ValueError(f"{where}: {key!r} and {other!r} name one tied tensor of the model, but the checkpoint "
                         "stores two different tensors under them")


def _shape_error(key: str, checkpoint: tuple[int, ...], model: tuple[int, ...]) -> ValueError:
    return ValueError(f"load_fp8_checkpoint: {key!r} has shape {list(checkpoint)} in the checkpoint, the model "
                      f"expects {list(model)}")


def _dtype_name(dtype: str) -> str:
    names = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", **{k: str(v)[6:] for k, v in FLOAT_DTYPES.items()}}
    return names.get(dtype, dtype)


def _plan_layer(prefix: str, module: nn.Linear | Fp8Linear, owners: list[Owner], ckpt: _Checkpoint) -> _Layer:
    weight_key, scale_key, bias_key = (_key(prefix, a) for a in ("weight", "weight" + SCALE_SUFFIX, "bias"))
    out_features, in_features = module.out_features, module.in_features
    dtype, shape = ckpt.meta(weight_key)
    kind: Literal["load", "convert", "quantize"]
    if dtype.startswith("F8_"):
        kind = "load" if isinstance(module, Fp8Linear) else "convert"
        if dtype != E4M3:
            raise ValueError(f"load_fp8_checkpoint: {weight_key!r} is {_dtype_name(dtype)} in the checkpoint; FP8 "
                             f"weights must be float8_e4m3fn")
        if scale_key not in ckpt:
            raise ValueError(f"load_fp8_checkpoint: {weight_key!r} is FP8 but the checkpoint has no {scale_key!r} "
                             f"(its {BLOCK}x{BLOCK} block scales)")
    elif dtype in FLOAT_DTYPES:  # an Fp8Linear given a high-precision weight
        kind = "quantize"
        if scale_key in ckpt:
            raise ValueError(f"load_fp8_checkpoint: {weight_key!r} is {_dtype_name(dtype)}, not FP8, yet the "
                             f"checkpoint has a {scale_key!r}")
    else:
        raise ValueError(f"load_fp8_checkpoint: {weight_key!r} is {_dtype_name(dtype)} in the checkpoint; an "
                         f"Fp8Linear takes float8_e4m3fn (with its block scales) or a float weight")
    if shape != (out_features, in_features):
        raise _shape_error(weight_key, shape, (out_features, in_features))
    keys = [weight_key]
    if kind != "quantize":
        scale_dtype, scale_shape = ckpt.meta(scale_key)
        expected = (ceil_div(out_features, BLOCK), ceil_div(in_features, BLOCK))
        if scale_dtype not in FLOAT_DTYPES:
            raise ValueError(f"load_fp8_checkpoint: {scale_key!r} is {_dtype_name(scale_dtype)} in the checkpoint; "
                             f"block scales must be float32, bfloat16 or float16")
        if scale_shape != expected:
            raise _shape_error(scale_key, scale_shape, expected)
        keys.append(scale_key)
    has_bias = module.bias is not None
    if has_bias and bias_key in ckpt:
        bias_dtype, bias_shape = ckpt.meta(bias_key)
        if bias_dtype not in FLOAT_DTYPES:
            raise ValueError(f"load_fp8_checkpoint: {bias_key!r} is {_dtype_name(bias_dtype)} in the checkpoint, "
                             f"expected a float tensor")
        if bias_shape != (out_features,):
            raise _shape_error(bias_key, bias_shape, (out_features,))
        keys.append(bias_key)
    return _Layer(prefix, module, owners, kind, keys, has_bias)


def _check_slot(key: str, slot: _Slot, ckpt: _Checkpoint) -> None:
    dtype, shape = ckpt.meta(key)
    if shape != tuple(slot.tensor.shape):
        raise _shape_error(key, shape, tuple(slot.tensor.shape))
    source_fp8 = dtype.startswith("F8_")
    target_fp8 = slot.tensor.is_floating_point() and slot.tensor.dtype.itemsize == 1
    if source_fp8 != target_fp8 or (source_fp8 and _FP8_FORMATS.get(dtype) != slot.tensor.dtype):
        hint = " (FP8 weights load into Fp8Linear or an nn.Linear, which is converted)" if source_fp8 else ""
        raise ValueError(f"load_fp8_checkpoint: {key!r} is {_dtype_name(dtype)} in the checkpoint, the model's "
                         f"tensor is {slot.tensor.dtype}{hint}")
    if (dtype in FLOAT_DTYPES or source_fp8) != slot.tensor.is_floating_point():
        raise ValueError(f"load_fp8_checkpoint: {key!r} is {_dtype_name(dtype)} in the checkpoint, the model's "
                         f"tensor is {slot.tensor.dtype}")


def _target(tensor: torch.Tensor, device: torch.device | None) -> torch.device:
    if device is not None:
        return device
    return torch.device("cpu") if tensor.device.type == "meta" else tensor.device


def _replaced(module: nn.Linear | Fp8Linear, device: torch.device | None) -> bool:
    """Whether loading replaces the module by a new Fp8Linear (rather than loading into it)."""
    return not isinstance(module, Fp8Linear) or module.weight.device != _target(module.weight, device)


def _plan(model: nn.Module, ckpt: _Checkpoint,
          device: torch.device | None) -> tuple[list[_Layer], list[_Slot], list[str], set[str]]:
    """(FP8 layers, other tensors, missing names, consumed checkpoint keys), checked before anything is loaded."""
    modules = list(model.named_modules(remove_duplicate=False))
    by_name = dict(modules)
    owners: dict[int, list[Owner]] = {}
    names: dict[int, list[str]] = {}
    for name, module in modules:
        names.setdefault(id(module), []).append(name)
        if name:
            parent, _, attribute = name.rpartition(".")
            owners.setdefault(id(module), []).append((by_name[parent], attribute))
    layers: list[_Layer] = []
    missing: list[str] = []
    consumed: set[str] = set()
    in_layer: set[int] = set()
    for name, module in modules:
        if id(module) in in_layer or not (isinstance(module, Fp8Linear) or type(module) is nn.Linear):
            continue
        prefix = next((n for n in names[id(module)] if _key(n, "weight") in ckpt), None)
        if prefix is None:
            continue  # not in the checkpoint: its tensors are reported missing below
        assert isinstance(module, (nn.Linear, Fp8Linear))
        if type(module) is nn.Linear and not ckpt.meta(_key(prefix, "weight"))[0].startswith("F8_"):
            continue  # a high-precision linear layer: its tensors load as they are
        layer = _plan_layer(prefix, module, owners.get(id(module), []), ckpt)
        if _replaced(module, device) and isinstance(module, Fp8Linear) and type(module) is not Fp8Linear:
            raise ValueError(f"load_fp8_checkpoint: {prefix!r} is a {type(module).__name__} on "
                             f"{module.weight.device}; a load would replace it by a plain Fp8Linear (losing what the "
                             "subclass adds, e.g. a tensor-parallel layer's all-reduce): build it on its device "
                             "(or call model.to_empty(device=...)) and load without 'device', or use its own loader "
                             "(deepgemm.distributed.shard_fp8_checkpoint)")
        if not layer.owners and _replaced(module, device):
            raise ValueError("load_fp8_checkpoint: the model itself is a layer this load must replace (an nn.Linear, "
                             "or on another device); load into a model that holds it, or build it as an Fp8Linear "
                             "on its device")
        in_layer.add(id(module))
        layers.append(layer)
        consumed.update(layer.keys)
        if layer.has_bias and _key(prefix, "bias") not in ckpt:
            missing.append(_key(prefix, "bias"))
    slots: dict[int, _Slot] = {}
    for name, module in modules:
        if id(module) in in_layer:
            continue
        persistent = [(a, t, False) for a, t in module._buffers.items() if a not in module._non_persistent_buffers_set]
        for attribute, tensor, is_parameter in [(a, t, True) for a, t in module._parameters.items()] + persistent:
            if tensor is None:
                continue
            slot = slots.setdefault(id(tensor), _Slot([], [], tensor, is_parameter))
            slot.names.append(_key(name, attribute))
            slot.owners.append((module, attribute))
    for slot in slots.values():
        present = [n for n in slot.names if n in ckpt]
        if not present:
            missing += slot.names
            continue
        slot.key = present[0]
        _check_slot(slot.key, slot, ckpt)
        for other in present[1:]:
            _check_same_tensor(slot.key, other, ckpt)
        consumed.update(present)  # a tied tensor stored under several names loads once
    return layers, [s for s in slots.values() if s.key is not None], missing, consumed


# ---------------------------------------------------------------------------------------------------- loading

def _normalize(device: torch.device | str | None) -> torch.device | None:
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "meta":
        raise ValueError("load_fp8_checkpoint: 'device' cannot be meta (the tensors are loaded onto it)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


@torch.no_grad()
def _load_layer(layer: _Layer, ckpt: _Checkpoint, device: torch.device | None, report: LoadReport) -> None:
    module = layer.module
    assert isinstance(module, (nn.Linear, Fp8Linear))
    target = _target(module.weight, device)
    tensors = {key.rpartition(".")[2]: ckpt.read(key).to(target) for key in layer.keys}
    weight = tensors["weight"]
    if layer.kind == "quantize":
        weight, scale = quantize_per_block(weight.float() if weight.dtype == torch.float64 else weight, BLOCK)
    else:
        scale = tensors["weight" + SCALE_SUFFIX]
    if not _replaced(module, device):
        assert isinstance(module, Fp8Linear)
        fp8 = module
    else:
        if isinstance(module, Fp8Linear):
            out_dtype = module.out_dtype
        else:
            out_dtype = module.weight.dtype if module.weight.dtype in OUT_DTYPES else torch.bfloat16
        fp8 = Fp8Linear(module.in_features, module.out_features, layer.has_bias, device=target, dtype=out_dtype)
        if isinstance(module, Fp8Linear) and module.bias is not None and fp8.bias is not None and \
                "bias" not in tensors and module.bias.device.type != "meta":
            fp8.bias.copy_(module.bias)  # moved to `device` without a checkpoint bias: keep its own
        fp8.train(module.training)
        for parent, attribute in layer.owners:
            setattr(parent, attribute, fp8)
    fp8.load_fp8_weight(weight, scale)
    if "bias" in tensors and fp8.bias is not None:
        fp8.bias.copy_(tensors["bias"])
    report.fp8_layers.append(layer.prefix)
    if layer.kind == "convert":
        report.converted.append(layer.prefix)
    elif layer.kind == "quantize":
        report.quantized.append(layer.prefix)


@torch.no_grad()
def _load_slot(slot: _Slot, ckpt: _Checkpoint, device: torch.device | None, report: LoadReport) -> None:
    assert slot.key is not None
    old = slot.tensor
    target = _target(old, device)
    read = ckpt.read(slot.key)
    value = read.to(device=target, dtype=old.dtype)
    if old.device == target:
        old.copy_(value)  # in place: ties, views and optimizer references stay valid
    else:
        if value.untyped_storage().data_ptr() == read.untyped_storage().data_ptr():
            value = value.clone()  # kept: not a view of the file's mapping (a file rewritten later would change it)
        parameter = nn.Parameter(value, requires_grad=old.requires_grad)
        for module, attribute in slot.owners:
            if slot.is_parameter:
                module._parameters[attribute] = parameter
            else:
                module._buffers[attribute] = value
    report.tensors.append(slot.key)


def load_fp8_checkpoint(model: nn.Module, path: str | os.PathLike[str], *,
                        device: torch.device | str | None = None, strict: bool = True) -> LoadReport:
    """Load an FP8 checkpoint (DeepSeek-V3 / V3.1 / R1, Qwen3-FP8 format) into `model`, in place.

    path: a .safetensors file, or a folder (its model.safetensors.index.json, else every *.safetensors in it); a
    config.json next to it whose quantization_config is not FP8 with 128x128 blocks is refused. For each module:
    an Fp8Linear loads `<name>.weight` (e4m3) and `<name>.weight_scale_inv` (converted to float32 once, here) through
    `load_fp8_weight`, plus its bias (a high-precision checkpoint weight is quantized per 128x128 block instead); an
    nn.Linear (exactly) whose checkpoint weight is FP8 is replaced by an Fp8Linear of its shape and bias (output
    dtype: its own if bfloat16/float32, else bfloat16) and loaded, so a model built in BF16 or on the meta device
    from its config loads an FP8 checkpoint directly; every other parameter and persistent buffer is copied from
    the tensor of its name (state_dict names), converted to its dtype.

    device: where the tensors go (default: where each module's tensors are; the CPU for those on the meta device).
    strict: raise one ValueError on missing or unexpected keys (default); with strict=False they are only reported
    (e.g. DeepSeek-V3's multi-token-prediction layer `model.layers.61.*`, which inference models leave out).
    Shapes, dtypes and scales are all checked before anything is loaded: a ValueError leaves the model untouched.
    Tensors are read one at a time (each file opened once), never the whole checkpoint at once.

    Args:
        model: the nn.Module to load into (built in BF16, on the meta device, or already converted).
        path / device / strict: see above.

    Returns:
        A LoadReport.

    Raises:
        ImportError: safetensors is not installed (pip install 'deepgemm[hf]').
        FileNotFoundError: `path` is neither a .safetensors file nor a folder holding them, or the index names a
            file that is not there.
        ValueError: the checkpoint does not fit the model (missing or unexpected keys under strict, a shape or
            dtype that differs, an FP8 weight without its scales, a tied tensor stored under two of its names with
            different values), config.json describes another quantization, the index cannot be read, or `device`
            is meta.

    Example::

        from deepgemm.nn import load_fp8_checkpoint

        with torch.device("meta"):
            model = build_model(config)          # your model class, with nn.Linear layers
        print(load_fp8_checkpoint(model, "/models/DeepSeek-V3", device="cuda", strict=False))
    """
    start = time.perf_counter()
    path = Path(path)
    target = _normalize(device)
    files, weight_map = _checkpoint_files(path)
    _check_quantization_config(path if path.is_dir() else path.parent)
    ckpt = _Checkpoint(files, weight_map)
    try:
        layers, slots, missing, consumed = _plan(model, ckpt, target)
        report = LoadReport(missing=sorted(missing), unexpected=sorted(set(ckpt.where) - consumed))
        if strict and (report.missing or report.unexpected):
            parts = [f"{what} {_listing(names)}" for what, names in
                     (("missing", report.missing), ("unexpected", report.unexpected)) if names]
            raise ValueError("load_fp8_checkpoint: the checkpoint does not match the model (pass strict=False to load "
                             "what matches): " + "; ".join(parts))
        # Read file by file, closing each after its last tensor.
        jobs: list[tuple[list[str], _Layer | _Slot]] = [(layer.keys, layer) for layer in layers]
        jobs += [([slot.key], slot) for slot in slots if slot.key is not None]
        jobs.sort(key=lambda job: min(ckpt.where[k] for k in job[0]))
        last_use = {ckpt.where[k]: n for n, (keys, _) in enumerate(jobs) for k in keys}
        for n, (_, job) in enumerate(jobs):
            if isinstance(job, _Layer):
                _load_layer(job, ckpt, target, report)
            else:
                _load_slot(job, ckpt, target, report)
            for i, last in last_use.items():
                if last == n:
                    ckpt.release(i)
    finally:
        ckpt.close()
    report.on_meta = [name for name, tensor in [*model.named_parameters(remove_duplicate=False),
                                                *model.named_buffers(remove_duplicate=False)]
                      if tensor.device.type == "meta"]
    report.files = [str(files[i]) for i in sorted(ckpt.read_files)]
    report.bytes_read = ckpt.bytes_read
    report.seconds = time.perf_counter() - start
    return report


# ---------------------------------------------------------------------------------------------------- saving

def save_fp8_checkpoint(model: nn.Module, folder: str | os.PathLike[str], *,
                        max_shard_bytes: int = 5 * 2**30) -> list[Path]:
    """Write `model`'s state_dict in the same format: Fp8Linear layers as `<name>.weight` e4m3 and
    `<name>.weight_scale_inv` float32, the rest as they are, in `model-0000i-of-0000n.safetensors` shards of at
    most `max_shard_bytes` (a bigger tensor gets a shard of its own) plus model.safetensors.index.json. A tensor
    tied under several names is written once, under its first. Returns the files written, the index last.

    Args:
        model: the nn.Module to save (no tensor on the meta device).
        folder: the output folder (created if needed).
        max_shard_bytes: the shard size limit, a positive int (default 5 GiB).

    Raises:
        ImportError: safetensors is not installed (pip install 'deepgemm[hf]').
        ValueError: `max_shard_bytes` is not a positive int, or a tensor is on the meta device.
        OSError: the folder or a file cannot be written.

    Example::

        from deepgemm.nn import load_fp8_checkpoint, save_fp8_checkpoint

        files = save_fp8_checkpoint(model, "/tmp/fp8-model", max_shard_bytes=2**30)
        load_fp8_checkpoint(other_model, "/tmp/fp8-model")
    """
    _safetensors()  # the clear ImportError when it is absent
    from safetensors.torch import save_file

    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes <= 0:
        raise ValueError(f"save_fp8_checkpoint: 'max_shard_bytes' must be a positive int, got {max_shard_bytes!r}")
    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes = [0]
    seen: set[tuple[int, int, tuple[int, ...], torch.dtype]] = set()
    for name, tensor in model.state_dict().items():
        if tensor.device.type == "meta":
            raise ValueError(f"save_fp8_checkpoint: {name!r} is on the meta device (it holds no data)")
        identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and identity in seen:
            continue
        seen.add(identity)
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and sizes[-1] + size > max_shard_bytes:
            shards.append({})
            sizes.append(0)
        shards[-1][name] = tensor
        sizes[-1] += size
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        file = out / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: t.detach().to("cpu").contiguous() for name, t in shard.items()}, str(file),
                  metadata={"format": "pt"})
        weight_map.update((name, file.name) for name in shard)
        written.append(file)
    index = out / INDEX
    index.write_text(json.dumps({"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}, indent=2) + "\n")
    written.append(index)
    return written
