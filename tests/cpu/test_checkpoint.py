"""load_fp8_checkpoint / save_fp8_checkpoint on CPU, on checkpoints written here in the DeepSeek-V3 format."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

safetensors_torch = pytest.importorskip("safetensors.torch")

import deepgemm  # noqa: E402
from deepgemm.nn.checkpoint import LoadReport, load_fp8_checkpoint, save_fp8_checkpoint  # noqa: E402
from deepgemm.nn.linear import Fp8Linear  # noqa: E402
from deepgemm.utils import calc_diff  # noqa: E402

pytestmark = pytest.mark.usefixtures("small_fp8_route")  # small layers take the FP8 path

FP8 = torch.float8_e4m3fn
H, V, Q, I = 256, 96, 200, 1200  # hidden, vocab, q_proj out (partial blocks, the dequantized route), MLP width
# prefix -> (out, in, bias). up/down run the FP8 GEMM (N resp. K partial in their last block); q_proj is too small
# and takes the routed (dequantized weight) path.
FP8_LAYERS = {
    "model.layers.0.self_attn.q_proj": (Q, H, True),
    "model.layers.0.mlp.up_proj": (I, H, True),
    "model.layers.0.mlp.down_proj": (H, I, False),
}


class Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)), persistent=False)


class Layer(nn.Module):
    def __init__(self, linear: type[nn.Module]) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(H)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = linear(H, Q, bias=True)
        self.mlp = nn.Module()
        self.mlp.up_proj = linear(H, I, bias=True)
        self.mlp.down_proj = linear(I, H, bias=False)
        self.mlp.register_buffer("e_score_correction_bias", torch.zeros(8))


class Tiny(nn.Module):
    """The shape of an HF decoder: embeddings, one layer of FP8 linears, a norm, a BF16 lm_head."""

    def __init__(self, linear: type[nn.Module] = nn.Linear) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(V, H)
        self.model.rotary_emb = Rotary()
        self.model.layers = nn.ModuleList([Layer(linear)])
        self.model.norm = nn.RMSNorm(H)
        self.lm_head = nn.Linear(H, V, bias=False)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.model.layers[0]
        x = self.model.embed_tokens(ids)
        h = layer.input_layernorm(x)
        q = layer.self_attn.q_proj(h)
        h = x + layer.mlp.down_proj(F.silu(layer.mlp.up_proj(h)))
        return self.lm_head(self.model.norm(h)), q


def bf16_model(linear: type[nn.Module] = nn.Linear) -> Tiny:
    return Tiny(linear).to(torch.bfloat16)


def fp8_model() -> Tiny:
    """Tiny in BF16 with Fp8Linear layers (built after the cast: Module.to(dtype) would cast their FP8 buffers)."""
    model = bf16_model()
    for prefix, (out, inp, bias) in FP8_LAYERS.items():
        parent, _, attribute = prefix.rpartition(".")
        setattr(model.get_submodule(parent), attribute, Fp8Linear(inp, out, bias))
    return model


def seeded() -> torch.Generator:
    seed = torch.seed() % (2**31)
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


def checkpoint_tensors(gen: torch.Generator, scale_dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of Tiny in the real format: e4m3 weights with 128x128 block scales, the rest in BF16/FP32."""
    tensors: dict[str, torch.Tensor] = {}
    for prefix, (out, inp, bias) in FP8_LAYERS.items():
        w = (torch.randn(out, inp, generator=gen) * 60).clamp(-448, 448).to(FP8)
        s = torch.exp(torch.randn((out + 127) // 128, (inp + 127) // 128, generator=gen) * 1.5) * 1e-3
        tensors[f"{prefix}.weight"] = w
        tensors[f"{prefix}.weight_scale_inv"] = s.to(scale_dtype)
        if bias:
            tensors[f"{prefix}.bias"] = torch.randn(out, generator=gen).to(torch.bfloat16)
    for name, shape in (("model.embed_tokens.weight", (V, H)), ("lm_head.weight", (V, H))):
        tensors[name] = (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)
    for name in ("model.layers.0.input_layernorm.weight", "model.norm.weight"):
        tensors[name] = (1 + 0.1 * torch.randn(H, generator=gen)).to(torch.bfloat16)
    tensors["model.layers.0.mlp.e_score_correction_bias"] = torch.randn(8, generator=gen)  # float32, as stored
    return tensors


# Sharded over two files; q_proj's weight and its scales land in different files.
FIRST_FILE = ("model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
              "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias")


def write_checkpoint(folder: Path, tensors: dict[str, torch.Tensor], config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    shards: list[dict[str, torch.Tensor]] = [{}, {}]
    for key, tensor in tensors.items():
        shards[0 if key in FIRST_FILE else 1][key] = tensor
    weight_map = {}
    for name, shard in zip(names, shards):
        safetensors_torch.save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    quantization = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps(config if config is not None else
                                                   {"model_type": "tiny", "quantization_config": quantization}))
    return folder


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = checkpoint_tensors(seeded())
    return write_checkpoint(tmp_path / "ckpt", tensors), tensors


def dequantized(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    return w.double() * s.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]


def check_loaded(model: Tiny, tensors: dict[str, torch.Tensor]) -> None:
    """Every tensor bit-exact, and each FP8 layer's forward against a float64 reference."""
    modules = dict(model.named_modules())
    gen = seeded()
    for prefix, (out, inp, bias) in FP8_LAYERS.items():
        layer = modules[prefix]
        assert type(layer) is Fp8Linear and layer.out_dtype == torch.bfloat16
        assert torch.equal(layer.weight.view(torch.uint8), tensors[f"{prefix}.weight"].view(torch.uint8))
        assert layer.weight_scale_inv.dtype == torch.float32
        assert torch.equal(layer.weight_scale_inv, tensors[f"{prefix}.weight_scale_inv"].float())
        if bias:
            assert torch.equal(layer.bias, tensors[f"{prefix}.bias"])
        x = torch.randn(33, inp, generator=gen).to(torch.bfloat16)
        w = dequantized(tensors[f"{prefix}.weight"], tensors[f"{prefix}.weight_scale_inv"])
        if layer.route == "fp8":  # x quantized per 1x128 group, as the layer does
            q, sf = deepgemm.quantize_per_token_group(x, 128)
            x64 = deepgemm.dequantize_per_token_group(q, sf, 128, torch.float64)
        else:
            x64 = x.double()
        ref = x64 @ w.t() + (tensors[f"{prefix}.bias"].double() if bias else 0)
        y = layer(x)
        assert y.dtype == torch.bfloat16 and y.shape == (33, out)
        assert calc_diff(y, ref) < 1e-5, (prefix, layer.route, calc_diff(y, ref))
    state = model.state_dict()
    for key, tensor in tensors.items():
        if tensor.dtype != FP8:
            assert torch.equal(state[key], tensor.to(state[key].dtype)), key
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == torch.bfloat16


def test_load_into_fp8linear_model(checkpoint: tuple[Path, dict[str, torch.Tensor]],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    folder, tensors = checkpoint
    model = fp8_model()
    import safetensors

    opened: list[str] = []
    real_open = safetensors.safe_open

    def counting_open(file: str, *args: object, **kwargs: object) -> object:
        opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", counting_open)
    report = load_fp8_checkpoint(model, folder)
    assert sorted(opened) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]  # once each
    assert isinstance(report, LoadReport)
    assert sorted(report.fp8_layers) == sorted(FP8_LAYERS) and report.converted == [] and report.quantized == []
    assert sorted(report.tensors) == sorted(["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                                             "model.layers.0.input_layernorm.weight",
                                             "model.layers.0.mlp.e_score_correction_bias"])
    assert report.missing == [] and report.unexpected == [] and report.on_meta == []
    assert [Path(f).name for f in report.files] == ["model-00001-of-00002.safetensors",
                                                     "model-00002-of-00002.safetensors"]
    assert report.bytes_read == sum(t.numel() * t.element_size() for t in tensors.values())
    assert "loaded 3 FP8 layer(s) (0 converted" in str(report)
    check_loaded(model, tensors)


def test_load_converts_bf16_linears(checkpoint: tuple[Path, dict[str, torch.Tensor]]) -> None:
    folder, tensors = checkpoint
    model = bf16_model()
    report = load_fp8_checkpoint(model, folder)
    assert sorted(report.converted) == sorted(FP8_LAYERS) == sorted(report.fp8_layers)
    assert report.missing == [] and report.unexpected == []
    check_loaded(model, tensors)
    # A float32 model's converted layers output float32.
    model32 = Tiny()
    load_fp8_checkpoint(model32, folder)
    assert model32.model.layers[0].mlp.up_proj.out_dtype == torch.float32
    assert model32.model.norm.weight.dtype == torch.float32


@pytest.mark.parametrize("device", [None, "cpu"])
def test_load_onto_a_meta_model(checkpoint: tuple[Path, dict[str, torch.Tensor]], device: str | None) -> None:
    folder, tensors = checkpoint
    with torch.device("meta"):
        model = bf16_model()
    report = load_fp8_checkpoint(model, folder, device=device)
    assert sorted(report.converted) == sorted(FP8_LAYERS)
    # The non-persistent rotary buffer is no checkpoint key: it is left on meta, and said so.
    assert report.missing == [] and report.on_meta == ["model.rotary_emb.inv_freq"]
    assert "still on the meta device" in str(report)
    assert all(t.device.type == "cpu" for n, t in model.state_dict().items())
    check_loaded(model, tensors)


def test_the_three_models_agree(checkpoint: tuple[Path, dict[str, torch.Tensor]]) -> None:
    folder, _ = checkpoint
    with torch.device("meta"):
        meta = bf16_model()
    models = [fp8_model(), bf16_model(), meta]
    for model in models:
        load_fp8_checkpoint(model, folder)
    ids = torch.randint(0, V, (3, 7), generator=seeded())
    with torch.no_grad():
        outputs = [model(ids) for model in models]
    for logits, q in outputs[1:]:
        assert torch.equal(logits, outputs[0][0]) and torch.equal(q, outputs[0][1])
    assert outputs[0][0].shape == (3, 7, V) and torch.isfinite(outputs[0][0].float()).all()


def test_bf16_scales_are_accepted(tmp_path: Path) -> None:
    tensors = checkpoint_tensors(seeded(), scale_dtype=torch.bfloat16)
    model = bf16_model()
    load_fp8_checkpoint(model, write_checkpoint(tmp_path, tensors))
    check_loaded(model, tensors)


def test_single_file_and_folder_without_index(tmp_path: Path) -> None:
    tensors = checkpoint_tensors(seeded())
    single = tmp_path / "one" / "model.safetensors"
    single.parent.mkdir()
    safetensors_torch.save_file(tensors, str(single))
    model = bf16_model()
    report = load_fp8_checkpoint(model, single)
    assert report.files == [str(single)]
    check_loaded(model, tensors)
    folder = write_checkpoint(tmp_path / "noindex", tensors)
    (folder / "model.safetensors.index.json").unlink()
    model = fp8_model()
    assert len(load_fp8_checkpoint(model, folder).files) == 2
    check_loaded(model, tensors)


def test_strict_missing_and_unexpected(tmp_path: Path) -> None:
    tensors = checkpoint_tensors(seeded())
    # DeepSeek-V3's multi-token-prediction layer: in the checkpoint, not in an inference model.
    mtp = {f"model.layers.1.mlp.experts.{e}.up_proj.{n}": t.clone() for e in range(6)
           for n, t in (("weight", tensors["model.layers.0.mlp.up_proj.weight"]),
                        ("weight_scale_inv", tensors["model.layers.0.mlp.up_proj.weight_scale_inv"]))}
    del tensors["model.norm.weight"]
    folder = write_checkpoint(tmp_path, {**tensors, **mtp})
    with pytest.raises(ValueError, match=r"missing 1 key\(s\): model.norm.weight; unexpected 12 key\(s\): "
                                         r"model.layers.1.mlp.experts.0.up_proj.weight, .*\(\+4 more\)"):
        load_fp8_checkpoint(bf16_model(), folder)
    model = bf16_model()
    before = model.model.norm.weight.clone()
    report = load_fp8_checkpoint(model, folder, strict=False)
    assert report.missing == ["model.norm.weight"] and report.unexpected == sorted(mtp)
    assert "missing: 1 key(s)" in str(report) and "unexpected: 12 key(s)" in str(report)
    assert torch.equal(model.model.norm.weight, before)  # left as it was
    assert sorted(report.converted) == sorted(FP8_LAYERS)
    # An FP8 layer with a bias the checkpoint lacks.
    del tensors["model.layers.0.mlp.up_proj.bias"]
    report = load_fp8_checkpoint(fp8_model(), write_checkpoint(tmp_path / "nobias", tensors), strict=False)
    assert report.missing == ["model.layers.0.mlp.up_proj.bias", "model.norm.weight"]


def test_wrong_shape_dtype_and_missing_scale(tmp_path: Path) -> None:
    good = checkpoint_tensors(seeded())
    up = "model.layers.0.mlp.up_proj"
    cases = {
        "shape": ({f"{up}.weight": good[f"{up}.weight"][:1100]},
                  rf"'{up}.weight' has shape \[1100, 256\] in the checkpoint, the model expects \[1200, 256\]"),
        "scale shape": ({f"{up}.weight_scale_inv": good[f"{up}.weight_scale_inv"][:-1]},
                        rf"'{up}.weight_scale_inv' has shape \[9, 2\] .* expects \[10, 2\]"),
        "norm shape": ({"model.norm.weight": good["model.norm.weight"][:100]},
                       r"'model.norm.weight' has shape \[100\]"),
        "e5m2": ({f"{up}.weight": good[f"{up}.weight"].float().to(torch.float8_e5m2)},
                 rf"'{up}.weight' is float8_e5m2 in the checkpoint; FP8 weights must be float8_e4m3fn"),
        "no scale": ({f"{up}.weight_scale_inv": None}, rf"'{up}.weight' is FP8 but the checkpoint has no "
                                                       rf"'{up}.weight_scale_inv'"),
        "fp8 lm_head subclass": ({"lm_head.weight": good["lm_head.weight"].float().to(FP8)},
                                 r"'lm_head.weight' is float8_e4m3fn in the checkpoint, the model's tensor"),
    }
    for case, (change, message) in cases.items():
        tensors = {k: v for k, v in {**good, **change}.items() if v is not None}
        folder = write_checkpoint(tmp_path / case.replace(" ", "_"), tensors)
        for model in (bf16_model(), fp8_model()):
            if case == "fp8 lm_head subclass":
                model.lm_head = type("MyLinear", (nn.Linear,), {})(H, V, bias=False)
            before = {k: v.clone() for k, v in model.state_dict().items()}
            with pytest.raises(ValueError, match=message):
                load_fp8_checkpoint(model, folder)
            after = model.state_dict()  # checked before anything loads: the model is untouched
            assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before), case


def test_other_block_sizes_are_refused(tmp_path: Path) -> None:
    tensors = checkpoint_tensors(seeded())
    config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}
    with pytest.raises(ValueError, match=r"weight_block_size \[64, 64\]: Fp8Linear takes 128x128"):
        load_fp8_checkpoint(bf16_model(), write_checkpoint(tmp_path / "a", tensors, config))
    config = {"quantization_config": {"quant_method": "gptq"}}
    with pytest.raises(ValueError, match=r"quant_method 'gptq'"):
        load_fp8_checkpoint(bf16_model(), write_checkpoint(tmp_path / "b", tensors, config))
    load_fp8_checkpoint(bf16_model(), write_checkpoint(tmp_path / "c", tensors, {"model_type": "tiny"}))


def test_round_trip(checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    folder, tensors = checkpoint
    model = bf16_model()
    load_fp8_checkpoint(model, folder)
    written = save_fp8_checkpoint(model, tmp_path / "saved", max_shard_bytes=200_000)
    assert written[-1].name == "model.safetensors.index.json" and len(written) > 3
    index = json.loads(written[-1].read_text())
    assert set(index["weight_map"]) == set(tensors)
    assert set(index["weight_map"].values()) == {p.name for p in written[:-1]}
    with torch.device("meta"):
        again = bf16_model()
    report = load_fp8_checkpoint(again, tmp_path / "saved")
    assert report.missing == [] and report.unexpected == [] and len(report.files) == len(written) - 1
    check_loaded(again, tensors)
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)


def test_high_precision_weights_are_quantized_into_fp8linear(tmp_path: Path) -> None:
    gen = seeded()
    source = bf16_model()
    for p in source.parameters():
        p.data = torch.randn(p.shape, generator=gen).to(p.dtype)
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(source.state_dict(), str(path))
    model = fp8_model()
    report = load_fp8_checkpoint(model, path)
    assert sorted(report.quantized) == sorted(FP8_LAYERS) and report.missing == []
    up = model.model.layers[0].mlp.up_proj
    q, sf = deepgemm.quantize_per_block(source.model.layers[0].mlp.up_proj.weight.detach(), 128)
    assert torch.equal(up.weight.view(torch.uint8), q.view(torch.uint8)) and torch.equal(up.weight_scale_inv, sf)


def test_tied_weights_load_once(tmp_path: Path) -> None:
    tensors = checkpoint_tensors(seeded())
    del tensors["lm_head.weight"]
    model = bf16_model()
    model.lm_head.weight = model.model.embed_tokens.weight
    report = load_fp8_checkpoint(model, write_checkpoint(tmp_path, tensors))
    assert report.missing == [] and model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, tensors["model.embed_tokens.weight"])


def test_tied_weight_stored_twice_must_agree(tmp_path: Path) -> None:
    """A tied tensor stored under two names loads once; it loaded the first name's values and ignored the second's
    without a word when they differed."""
    tensors = checkpoint_tensors(seeded())
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    model = bf16_model()
    model.lm_head.weight = model.model.embed_tokens.weight
    report = load_fp8_checkpoint(model, write_checkpoint(tmp_path / "same", tensors))  # equal copies: fine
    assert report.missing == [] and report.unexpected == []
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])
    tensors["lm_head.weight"][3, 5] += 1
    model = bf16_model()
    model.lm_head.weight = model.model.embed_tokens.weight
    before = model.lm_head.weight.clone()
    with pytest.raises(ValueError, match=r"'lm_head\.weight'.*'model\.embed_tokens\.weight'|"
                                         r"'model\.embed_tokens\.weight'.*'lm_head\.weight'"):
        load_fp8_checkpoint(model, write_checkpoint(tmp_path / "differ", tensors))
    assert torch.equal(model.lm_head.weight, before)  # checked before anything was loaded


def test_without_safetensors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path, checkpoint_tensors(seeded()))
    monkeypatch.setitem(sys.modules, "safetensors", None)
    with pytest.raises(ImportError, match=r"pip install deepgemm\[hf\]"):
        load_fp8_checkpoint(bf16_model(), folder)
    with pytest.raises(ImportError, match=r"pip install deepgemm\[hf\]"):
        save_fp8_checkpoint(bf16_model(), tmp_path / "out")


# ---------------------------------------------------------------- review findings (2026-12-05)


def test_loaded_tensors_do_not_map_the_file(checkpoint: tuple[Path, dict[str, torch.Tensor]]) -> None:
    """Tensors read into a meta-built model stayed views of the file's mapping: a file copied over the checkpoint
    after the load changed the model's weights (or killed the process with SIGBUS when shorter)."""
    folder, tensors = checkpoint
    with torch.device("meta"):
        model = bf16_model()
    load_fp8_checkpoint(model, folder)
    before = model.model.embed_tokens.weight.clone()
    for file in folder.glob("*.safetensors"):
        file.write_bytes(b"\0" * file.stat().st_size)  # (rewritten in place: the same inode)
    assert torch.equal(model.model.embed_tokens.weight, before)


def test_a_parallel_subclass_on_meta_is_not_swapped_for_a_plain_layer(tmp_path: Path) -> None:
    """An Fp8Linear subclass (a tensor-parallel layer) built on meta was replaced by a plain Fp8Linear: the layer
    lost its all-reduce and the report said nothing."""
    class Sub(Fp8Linear):
        pass

    gen = seeded()
    weight = (torch.randn(256, 256, generator=gen) * 60).clamp(-448, 448).to(FP8)
    path = tmp_path / "one.safetensors"
    safetensors_torch.save_file({"lin.weight": weight, "lin.weight_scale_inv": torch.ones(2, 2)}, str(path))
    model = nn.Module()
    with torch.device("meta"):
        model.lin = Sub(256, 256, bias=False)
    with pytest.raises(ValueError, match="'lin' is a Sub on meta; a load would replace it by a plain Fp8Linear"):
        load_fp8_checkpoint(model, path)
    assert type(model.lin) is Sub


def test_fp8_tensors_load_only_into_their_own_format(tmp_path: Path) -> None:
    """An e5m2 tensor outside a linear layer loaded into an e4m3 buffer (values saturated, scales kept)."""
    holder = nn.Module()
    holder.register_buffer("experts", torch.zeros(4, 128, dtype=FP8))
    path = tmp_path / "e5m2.safetensors"
    safetensors_torch.save_file({"experts": torch.ones(4, 128).to(torch.float8_e5m2)}, str(path))
    with pytest.raises(ValueError, match="'experts' is float8_e5m2 in the checkpoint, the model's tensor is "
                                         "torch.float8_e4m3fn"):
        load_fp8_checkpoint(holder, path)


def test_malformed_files_and_indexes_name_the_file(tmp_path: Path) -> None:
    """safetensors' own error type (a plain Exception naming no file), a FIFO that hung the load, index values
    that are not names and an index pointing outside its folder are ValueErrors naming the file."""
    import os

    model = fp8_model()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match=f"{bad} is not a readable safetensors file"):
        load_fp8_checkpoint(model, bad)
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "model.safetensors")
    with pytest.raises(ValueError, match="is not a regular file"):
        load_fp8_checkpoint(model, fifo_dir)
    for weight_map, message in (({"a": 3}, "values must be file names"),
                                ({"a": "../outside.safetensors"}, "not a file of")):
        folder = tmp_path / f"index{len(message)}"
        folder.mkdir()
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(ValueError, match=message):
            load_fp8_checkpoint(model, folder)
