"""`shard_fp8_checkpoint`: load a tensor-parallel model from an FP8 checkpoint of the whole model, each rank
reading only its slice of every parallel layer's `weight` / `weight_scale_inv` (safetensors `get_slice` reads a
part of a tensor from the file without loading the rest); every other tensor is read whole.

The format and the file handling are deepgemm.nn.checkpoint's (the DeepSeek-V3 / R1, Qwen3-FP8 layout: e4m3
`<prefix>.weight` [N, K] and `<prefix>.weight_scale_inv` [ceil(N/128), ceil(K/128)], a folder with
model.safetensors.index.json or single files).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from deepgemm.distributed.linear import _ParallelFp8Linear
from deepgemm.nn.checkpoint import (
    E4M3,
    FLOAT_DTYPES,
    SCALE_SUFFIX,
    LoadReport,
    _FP8_FORMATS,
    _Checkpoint,
    _check_quantization_config,
    _check_same_tensor,
    _checkpoint_files,
    _dtype_name,
    _key,
    _listing,
)
from deepgemm.nn.linear import BLOCK, Fp8Linear
from deepgemm.ops import quantize_per_block
from deepgemm.utils import ceil_div

WHERE = "shard_fp8_checkpoint"


def read_slice(ckpt: _Checkpoint, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
    """Rows (dim 0) or columns (dim 1) [start, stop) of a checkpoint tensor, read from its file without the rest
    (counted in ckpt.bytes_read)."""
    i = ckpt.where[name]
    part = ckpt.handles[i].get_slice(name)
    tensor: torch.Tensor = (part[start:stop] if dim == 0 else part[:, start:stop]).contiguous()
    ckpt.read_files.add(i)
    ckpt.bytes_read += tensor.numel() * tensor.element_size()
    return tensor


@dataclass
class _ParallelLayer:
    prefix: str
    module: _ParallelFp8Linear
    quantize: bool  # the checkpoint weight is high precision: quantize this rank's slice per 128x128 block
    bias_key: str | None


def _plan_parallel(prefix: str, module: _ParallelFp8Linear, ckpt: _Checkpoint) -> tuple[_ParallelLayer, list[str]]:
    """Check the checkpoint's tensors of one parallel layer against the whole layer's shape (before any read)."""
    weight_key, scale_key, bias_key = (_key(prefix, a) for a in ("weight", "weight" + SCALE_SUFFIX, "bias"))
    full = (module.full_out_features, module.full_in_features)
    dtype, shape = ckpt.meta(weight_key)
    if shape != full:
        raise ValueError(f"{WHERE}: {weight_key!r} has shape {list(shape)} in the checkpoint, the whole layer "
                         f"{type(module).__name__} expects {list(full)} (the checkpoint must hold unsharded "
                         f"tensors: each rank reads its slice)")
    if dtype == E4M3:
        if scale_key not in ckpt:
            raise ValueError(f"{WHERE}: {weight_key!r} is FP8 but the checkpoint has no {scale_key!r} (its "
                             f"{BLOCK}x{BLOCK} block scales)")
        scale_dtype, scale_shape = ckpt.meta(scale_key)
        scales = (ceil_div(full[0], BLOCK), ceil_div(full[1], BLOCK))
        if scale_dtype not in FLOAT_DTYPES:
            raise ValueError(f"{WHERE}: {scale_key!r} is {_dtype_name(scale_dtype)} in the checkpoint; block scales "
                             f"must be float32, bfloat16 or float16")
        if scale_shape != scales:
            raise ValueError(f"{WHERE}: {scale_key!r} has shape {list(scale_shape)} in the checkpoint, the whole "
                             f"layer {type(module).__name__} {list(full)} expects {list(scales)}")
        keys, quantize = [weight_key, scale_key], False
    elif dtype in FLOAT_DTYPES and scale_key not in ckpt:
        keys, quantize = [weight_key], True
    else:
        raise ValueError(f"{WHERE}: {weight_key!r} is {_dtype_name(dtype)} in the checkpoint; a parallel FP8 layer "
                         f"takes float8_e4m3fn with its block scales, or a float weight (quantized at load)")
    has_bias = module.bias is not None and bias_key in ckpt
    if has_bias:
        bias_dtype, bias_shape = ckpt.meta(bias_key)
        if bias_dtype not in FLOAT_DTYPES or bias_shape != (full[0],):
            raise ValueError(f"{WHERE}: {bias_key!r} is {_dtype_name(bias_dtype)} {list(bias_shape)} in the "
                             f"checkpoint, expected a float tensor [{full[0]}]")
        keys.append(bias_key)
    return _ParallelLayer(prefix, module, quantize, bias_key if has_bias else None), keys


@torch.no_grad()
def _load_parallel(layer: _ParallelLayer, ckpt: _Checkpoint) -> None:
    module = layer.module
    device = module.weight.device
    dim, (start, stop), (s_start, s_stop) = module.shard_index()
    weight = read_slice(ckpt, _key(layer.prefix, "weight"), dim, start, stop).to(device)
    if layer.quantize:
        # Shards start on 128 boundaries, so the slice's blocks are the whole weight's blocks.
        weight, scale = quantize_per_block(weight.float() if weight.dtype == torch.float64 else weight, BLOCK)
    else:
        scale = read_slice(ckpt, _key(layer.prefix, "weight" + SCALE_SUFFIX), dim, s_start, s_stop).to(device)
    module.load_fp8_weight(weight, scale)
    if layer.bias_key is not None and module.bias is not None:
        if dim == 0:  # column-parallel: this rank's part of the bias
            bias = read_slice(ckpt, layer.bias_key, 0, start, stop)
        else:  # row-parallel adds the whole bias once, after the reduction
            bias = ckpt.read(layer.bias_key)
        module.bias.copy_(bias.to(device))


def shard_fp8_checkpoint(model: nn.Module, path: str | os.PathLike[str], *, strict: bool = True) -> LoadReport:
    """Load `model` (built with ColumnParallelFp8Linear / RowParallelFp8Linear layers on this rank's device)
    from an FP8 checkpoint of the whole, unsharded model, in place.

    Each parallel layer `<name>` reads only its rank's rows (column-parallel) or columns (row-parallel) of
    `<name>.weight` and the matching 128-blocks of `<name>.weight_scale_inv`, and its part of `<name>.bias` (all of
    it for row-parallel); a high-precision checkpoint weight is read the same way and its slice quantized per
    128x128 block. Every other parameter and persistent buffer (norms, embeddings, non-parallel Fp8Linear layers) is
    read whole and copied into the tensor of its state_dict name, converted to its dtype. The model's tensors must be
    on a real device (not meta); an nn.Linear whose checkpoint weight is FP8 is refused (convert or shard it first).

    strict: raise one ValueError on missing or unexpected keys (default); False only reports them. Everything is
    checked before anything is loaded. Returns deepgemm.nn's LoadReport (`bytes_read` counts the slices only).

    Args:
        model: the model of this rank, parallel layers built (on their device) with the whole layer's shapes.
        path: a .safetensors file or a folder, as for deepgemm.nn.load_fp8_checkpoint.
        strict: see above.

    Raises:
        ImportError, FileNotFoundError: as for deepgemm.nn.load_fp8_checkpoint.
        ValueError: the checkpoint does not fit the model (missing or unexpected keys under strict, a shape or
            dtype that differs, an FP8 weight without its scales, an nn.Linear whose checkpoint weight is FP8, a tied
            tensor stored under two of its names with different values), a model tensor is on the meta device, or
            config.json describes another quantization.

    Example::

        from deepgemm.distributed import shard_fp8_checkpoint

        model = build_tensor_parallel_model(config).to("cuda")   # your model, with the parallel layers
        print(shard_fp8_checkpoint(model, "/models/DeepSeek-V3", strict=False))
    """
    start_time = time.perf_counter()
    path = Path(path)
    files, weight_map = _checkpoint_files(path)
    _check_quantization_config(path if path.is_dir() else path.parent)
    ckpt = _Checkpoint(files, weight_map)
    try:
        layers: list[_ParallelLayer] = []
        consumed: set[str] = set()
        missing: list[str] = []
        in_layer: set[int] = set()
        for name, module in model.named_modules():
            if isinstance(module, _ParallelFp8Linear):
                in_layer.add(id(module))
                if _key(name, "weight") not in ckpt:
                    missing.append(_key(name, "weight"))
                    continue
                if module.weight.is_meta:
                    raise ValueError(f"{WHERE}: {name or '(root)'} is on the meta device; build the model on its "
                                     f"device (or call model.to_empty(device=...)) first")
                layer, keys = _plan_parallel(name, module, ckpt)
                layers.append(layer)
                consumed.update(keys)
                if module.bias is not None and layer.bias_key is None:
                    missing.append(_key(name, "bias"))
        slots: list[tuple[str, torch.Tensor]] = []
        absent: list[tuple[str, int]] = []  # (name, tensor id): missing unless the tensor loads under another name
        first_key: dict[int, str] = {}  # tensor id -> the name it loads under (tied tensors: the first present)
        refresh: list[Fp8Linear] = []
        for name, module in model.named_modules():
            if id(module) in in_layer:
                continue
            if isinstance(module, Fp8Linear):
                refresh.append(module)
            own = [*module.named_parameters(recurse=False),
                   *((a, t) for a, t in module.named_buffers(recurse=False)
                     if a not in module._non_persistent_buffers_set)]
            for attribute, tensor in own:
                key = _key(name, attribute)
                if key not in ckpt:
                    absent.append((key, id(tensor)))
                    continue
                dtype, shape = ckpt.meta(key)
                if shape != tuple(tensor.shape):
                    raise ValueError(f"{WHERE}: {key!r} has shape {list(shape)} in the checkpoint, the model expects "
                                     f"{list(tensor.shape)}")
                source_fp8, source_float = dtype.startswith("F8_"), dtype.startswith("F8_") or dtype in FLOAT_DTYPES
                if (source_fp8 != (tensor.dtype.itemsize == 1 and tensor.is_floating_point())
                        or (source_fp8 and _FP8_FORMATS.get(dtype) != tensor.dtype)
                        or source_float != tensor.is_floating_point()):
                    hint = " (an FP8 weight loads into Fp8Linear or a parallel FP8 layer)" if dtype.startswith("F8_") \
                        else ""
                    raise ValueError(f"{WHERE}: {key!r} is {_dtype_name(dtype)} in the checkpoint, the model's tensor "
                                     f"is {tensor.dtype}{hint}")
                if tensor.is_meta:
                    raise ValueError(f"{WHERE}: {key!r} is on the meta device; build the model on its device first")
                consumed.add(key)
                first = first_key.setdefault(id(tensor), key)
                if first == key:
                    slots.append((key, tensor))
                else:  # a tied tensor stored under several names loads once, from copies that must agree
                    _check_same_tensor(first, key, ckpt, WHERE)
        loaded = set(first_key)
        missing += [key for key, tensor_id in absent if tensor_id not in loaded]
        report = LoadReport(missing=sorted(missing), unexpected=sorted(set(ckpt.where) - consumed))
        if strict and (report.missing or report.unexpected):
            parts = [f"{what} {_listing(names)}" for what, names in
                     (("missing", report.missing), ("unexpected", report.unexpected)) if names]
            raise ValueError(f"{WHERE}: the checkpoint does not match the model (pass strict=False to load what "
                             f"matches): " + "; ".join(parts))
        for layer in layers:
            _load_parallel(layer, ckpt)
            report.fp8_layers.append(layer.prefix)
            if layer.quantize:
                report.quantized.append(layer.prefix)
        with torch.no_grad():
            for key, tensor in slots:
                tensor.copy_(ckpt.read(key))  # in place: ties and views stay valid
                report.tensors.append(key)
        for fp8 in refresh:
            fp8.refresh()  # its weight and scales were copied as tensors
    finally:
        ckpt.close()
    report.files = [str(files[i]) for i in sorted(ckpt.read_files)]
    report.bytes_read = ckpt.bytes_read
    report.seconds = time.perf_counter() - start_time
    return report
