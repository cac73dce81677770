"""Freeze the kernels a tree builds for a fixed list of picks and compare their machine code across a refactor.

  python dev/sass_freeze.py cases CASES.json                    the pick list (dense grid, decode, FP32, tails,
                                                                clusters, grouped, k-grouped, quantizers)
  python dev/sass_freeze.py build CASES.json OUT.json SASS_DIR [--adapter FILE]
                                                                render (this tree, or FILE's source(case) for
                                                                another tree on PYTHONPATH), compile, disassemble
  python dev/sass_freeze.py diff OLD.json OLD_SASS NEW.json NEW_SASS

SASS is normalized (addresses, encodings, the entry's name) and hashed. `diff` compares everything but the
constexpr data objects NVRTC emits: every static constexpr member of an instantiated class becomes a device object
(.nv.global.init, .nv.global, listed in .nv.constant4) whose mangled name carries the class's template arguments,
so a new template parameter renames them although no instruction changes; labels are renumbered in order of
appearance. The rest (.text with every instruction, .nv.info, .nv.callgraph, ...), the ptxas resources and the
config label must match.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.model_ab import DEEPSEEK_NK, grid  # noqa: E402 - the 99-shape dense grid

SMS = 132
H200 = "NVIDIA H200"

CONTIGUOUS = [(4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168), (8, 4096, 7168, 2048)]
MASKED = [(1, 1024, 4096, 4096, 7168), (2, 512, 4096, 4096, 7168), (4, 256, 4096, 4096, 7168), (1, 1024, 4096, 7168, 2048),
          (2, 512, 4096, 7168, 2048), (4, 256, 4096, 7168, 2048), (32, 16, 128, 4096, 7168), (256, 8, 128, 2048, 7168),
          (64, 32, 128, 7168, 2048), (8, 64, 128, 4096, 7168)]
KGROUPED = [(4096, 7168), (7168, 2048), (64, 40), (256, 200)]


def counts_for(groups: int, expected: int, rng: random.Random, cap: int | None = None) -> list[int]:
    return [min(cap or 1 << 30, max(1, round(expected * rng.uniform(0.7, 1.3)))) for _ in range(groups)]


def dense_cases() -> list[dict]:
    decode = [(m, n, k) for n, k in DEEPSEEK_NK for m in (1, 16, 64, 128)]
    fp32 = [(4096, n, k) for n, k in DEEPSEEK_NK] + [(128, n, k) for n, k in DEEPSEEK_NK[:4]]
    cases = []
    for m, n, k in grid() + decode:
        for gpu in (None, H200):
            cases.append({"kind": "dense", "m": m, "n": n, "k": k, "out": "bf16", "gpu": gpu})
    for m, n, k in fp32:
        cases.append({"kind": "dense", "m": m, "n": n, "k": k, "out": "fp32", "gpu": None})
    # Variants the tuner and A/B switches build: clusters, stream/split tails, full-width last N-blocks.
    variants = [
        (4096, 7168, 16384, 128, 128, {"cluster_m": 2}),
        (4096, 2112, 7168, 128, 192, {"stream_tail": True}),
        (4096, 4096, 7168, 256, 128, {"stream_tail": True}),
        (256, 7168, 16384, 128, 128, {"split_tail": True}),
        (4096, 2112, 7168, 192, 128, {"split_tail": True}),
    ]
    for m, n, k, bm, bn, extra in variants:
        cases.append({"kind": "dense", "m": m, "n": n, "k": k, "out": "bf16", "tile": [bm, bn], "extra": extra})
    for m, n, k in [(4096, 2112, 7168), (128, 2112, 7168), (4096, 4096, 7168)]:
        cases.append({"kind": "dense", "m": m, "n": n, "k": k, "out": "bf16", "gpu": None, "wide_last_n": True})
    return cases


def grouped_cases() -> list[dict]:
    rng = random.Random(0)
    cases = []
    for g, e, n, k in CONTIGUOUS:
        counts = counts_for(g, e, rng)
        m_total = sum(-(-c // 128) * 128 for c in counts)
        for kind in ("contiguous", "psum"):
            cases.append({"kind": kind, "groups": g, "m_total": m_total, "n": n, "k": k, "out": "bf16"})
        cases.append({"kind": "contiguous", "groups": g, "m_total": m_total, "n": n, "k": k, "out": "fp32"})
    for g, e, max_m, n, k in MASKED:
        counts_for(g, e, rng, cap=max_m)
        cases.append({"kind": "masked", "groups": g, "expected_m": e, "max_m": max_m, "n": n, "k": k, "out": "bf16"})
    for m, n in KGROUPED:
        cases.append({"kind": "kgrouped", "m": m, "n": n})
    for dtype in ("float32", "bfloat16", "float16"):
        cases.append({"kind": "quantize_token_group", "dtype": dtype, "size": 128})
        cases.append({"kind": "quantize_block", "dtype": dtype, "size": 128})
    return cases


def case_key(case: dict) -> str:
    return json.dumps(case, sort_keys=True)


def normalize_sass(text: str) -> str:
    lines = []
    for line in text.splitlines():
        line = re.sub(r"/\*[0-9a-fx]+\*/", "", line)  # addresses and encodings
        line = line.replace("deepgemm_", "ENTRY_")
        line = line.strip()
        if line and not line.startswith("//"):
            lines.append(line)
    return "\n".join(lines) + "\n"


def nvdisasm() -> str:
    import nvidia  # the nvidia-cuda-nvdisasm wheel

    for root in nvidia.__path__:
        candidate = Path(root) / "cu13" / "bin" / "nvdisasm"
        if candidate.exists():
            return str(candidate)
    raise SystemExit("nvdisasm not found")


def build(cases_path: str, out_path: str, sass_dir: str, adapter_path: str | None) -> None:
    from deepgemm.jit.compiler import compile_kernel

    adapter = sys.modules[__name__] if adapter_path is None else _load(adapter_path)

    cases = json.loads(Path(cases_path).read_text())
    Path(sass_dir).mkdir(parents=True, exist_ok=True)
    rendered = [adapter.source(case) for case in cases]
    distinct = list(dict.fromkeys(src.code for _, src in rendered))
    by_code = {src.code: src for _, src in rendered}
    with ThreadPoolExecutor(2) as pool:
        built = dict(zip(distinct, pool.map(lambda code: compile_kernel(by_code[code]), distinct)))
    tool = nvdisasm()
    result = {}
    for case, (label, src) in zip(cases, rendered):
        compiled = built[src.code]
        sass = normalize_sass(subprocess.run([tool, str(compiled.cubin_path)], capture_output=True, text=True,
                                             check=True).stdout)
        digest = hashlib.sha256(sass.encode()).hexdigest()[:16]
        (Path(sass_dir) / f"{digest}.sass").write_text(sass)
        res = compiled.resources
        result[case_key(case)] = {"label": label, "sass": digest, "source": hashlib.sha256(src.code.encode()).hexdigest()[:16],
                                  "resources": None if res is None else vars(res)}
    Path(out_path).write_text(json.dumps(result, indent=1))
    print(f"{len(cases)} cases, {len(distinct)} distinct kernels")


DATA_SECTIONS = (".nv.constant4", ".nv.global", ".nv.global.init")


def code_only(text: str) -> str:
    out, keep, labels = [], True, {}
    for line in text.splitlines():
        if line.startswith(".section"):
            keep = not any(f"\t{s}," in line or f" {s}," in line for s in DATA_SECTIONS)
        if keep:
            out.append(re.sub(r"\.L_(x_)?\d+", lambda m: labels.setdefault(m.group(0), f".L{len(labels)}"), line))
    return "\n".join(out) + "\n"


def diff(old_path: str, old_dir: str, new_path: str, new_dir: str) -> int:
    old, new = json.loads(Path(old_path).read_text()), json.loads(Path(new_path).read_text())
    bad = 0
    for key, before in old.items():
        after = new.get(key)
        a = code_only((Path(old_dir) / f"{before['sass']}.sass").read_text())
        b = code_only((Path(new_dir) / f"{after['sass']}.sass").read_text()) if after else None
        if b != a or after["resources"] != before["resources"] or after["label"] != before["label"]:
            print(f"DIFFERS: {key}\n  old {before['label']} {before['resources']}\n"
                  f"  new {after and after['label']} {after and after['resources']}")
            bad += 1
    kernels = len({v["sass"] for v in old.values()})
    print(f"{len(old)} cases ({kernels} distinct kernels): {bad} differ in code, other sections, resources or label")
    return 1 if bad else 0


def _load(path: str):  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location("sass_freeze_adapter", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- this tree's adapter: case -> (label, KernelSource) -------------------------------------------------------

def source(case: dict):  # noqa: ANN201 - (label, KernelSource)
    from dataclasses import replace

    from deepgemm.api.gemm import planned_spec
    from deepgemm.kernels.common.hopper import elem_bytes
    from deepgemm.kernels.quantize_fp8 import launch as quantize
    from deepgemm.kernels.sm90_fp8_gemm_1d1d import spec as kgrouped
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics import choose_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind, GemmProblem
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, render_source

    out = {"bf16": torch.bfloat16, "fp32": torch.float32}
    kinds = {"contiguous": GemmKind.GROUPED_CONTIGUOUS, "psum": GemmKind.GROUPED_CONTIGUOUS_PSUM,
             "masked": GemmKind.GROUPED_MASKED}
    kind = case["kind"]
    if kind == "dense":
        dtype = out[case["out"]]
        if "tile" in case:
            e = case["extra"]
            config = make_config(case["m"], case["n"], case["k"], *case["tile"], SMS, elem_bytes(dtype),
                                 cluster_m=e.get("cluster_m", 1), split_tail=e.get("split_tail", False),
                                 stream_tail=e.get("stream_tail", False))
            spec = Fp8GemmSpec(case["n"], case["k"], dtype, config)
        else:
            spec = planned_spec(case["m"], case["n"], case["k"], dtype, SMS, case["gpu"])
            if case.get("wide_last_n"):
                spec = replace(spec, config=replace(spec.config, narrow_last_n=False))
        return spec.label(), render_source(spec)
    if kind in kinds:
        dtype = out[case["out"]]
        rows = case["expected_m"] if kind == "masked" else case["m_total"]
        problem = GemmProblem(rows, case["n"], case["k"], SMS, dtype, kinds[kind], case["groups"], case.get("max_m", 0))
        spec = Fp8GemmSpec(case["n"], case["k"], dtype, choose_config(problem), kinds[kind])
        return spec.label(), render_source(spec)
    if kind == "kgrouped":
        kspec = kgrouped.KGroupedSpec.for_shape(case["m"], case["n"])
        return kspec.label(), kgrouped.render_source(kspec)
    dtype = getattr(torch, case["dtype"])
    made = quantize.token_group_source if kind == "quantize_token_group" else quantize.block_source
    src = made(dtype, case["size"])
    return src.label, src


def main() -> int:
    verb = sys.argv[1]
    if verb == "cases":
        Path(sys.argv[2]).write_text(json.dumps(dense_cases() + grouped_cases(), indent=1))
        return 0
    if verb == "build":
        args = sys.argv[2:]
        adapter = args[args.index("--adapter") + 1] if "--adapter" in args else None
        build(args[0], args[1], args[2], adapter)
        return 0
    return diff(*sys.argv[2:6])


if __name__ == "__main__":
    sys.exit(main())
