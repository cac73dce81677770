"""Cache keys, disk-cache hits, cross-process races and corrupted entries; no GPU."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deepgemm.errors import CacheError, CompileError
from deepgemm.jit import compiler
from deepgemm.jit.cache import LAYOUT_VERSION, STALE_STAGING_S, cache_key, KernelCache, tree_digest
from deepgemm.jit.compiler import compile_kernel, include_dir, kernel_key, KernelSource
from tests.cpu.test_jit_compiler import private_cache, shared_nvrtc_headers  # noqa: F401 (fixtures)

KERNEL = KernelSource(
    code=r"""
extern "C" __global__ void __launch_bounds__(384, 1) deepgemm_kernel(int* flags) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    flags[threadIdx.x] = threadIdx.x;
}
""",
    label="cache test kernel",
)
REPO_ROOT = Path(compiler.__file__).resolve().parents[2]

# Run in fresh interpreters: counts (and optionally slows or forbids) compiles
# by wrapping compiler._run_process, then prints what compile_kernel returned.
# deepgemm/__init__ (which pulls in torch) is bypassed: this layer needs no torch.
CHILD = r"""
import hashlib, json, os, sys, time, types
package = types.ModuleType("deepgemm")
package.__path__ = [os.path.join(os.environ["DEEPGEMM_TEST_ROOT"], "deepgemm")]
sys.modules["deepgemm"] = package
from deepgemm.jit import compiler

mode, counter, go, code = sys.argv[1:5]
if mode == "key":
    print(json.dumps({"key": compiler.kernel_key(compiler.KernelSource(code=code), "nvrtc")}))
    sys.exit(0)
original = compiler._run_process

def counted(*args, **kwargs):
    if mode == "forbid":
        raise AssertionError("a compiler was started")
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(1.0)  # let the other racers pile up on the lock
    return original(*args, **kwargs)

compiler._run_process = counted
while not os.path.exists(go):
    time.sleep(0.005)
kernel = compiler.compile_kernel(compiler.KernelSource(code=code))
cubin = kernel.cubin_path.read_bytes()
assert "torch" not in sys.modules
print(json.dumps({"key": kernel.key, "path": str(kernel.cubin_path),
                  "sha": hashlib.sha256(cubin).hexdigest(), "magic": cubin[:4].hex()}))
"""


@pytest.fixture(autouse=True)
def nvrtc_and_package_headers(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On top of the private cache: NVRTC, and the package's own include tree."""
    monkeypatch.setenv("DEEPGEMM_COMPILER", "nvrtc")
    monkeypatch.delenv("DEEPGEMM_INCLUDE_DIR", raising=False)


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every compiler process that compile_kernel starts."""
    started: list[str] = []
    original: Callable[..., Any] = compiler._run_process

    def counted(argv: list[str], what: str, *args: Any, **kwargs: Any) -> Any:
        started.append(what)
        return original(argv, what, *args, **kwargs)

    monkeypatch.setattr(compiler, "_run_process", counted)
    return started


def _spawn_children(mode: str, count: int, tmp_path: Path) -> list[dict[str, str]]:
    """Start ``count`` CHILD processes, release them at once, collect replies."""
    go = tmp_path / "go"
    argv = [sys.executable, "-c", CHILD, mode, str(tmp_path / "compiles"), str(go), KERNEL.code]
    env = {**os.environ, "DEEPGEMM_TEST_ROOT": str(REPO_ROOT)}
    children = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(count)
    ]
    time.sleep(0.3)
    go.touch()
    replies = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        replies.append(json.loads(out))
    return replies


def _compile_count(tmp_path: Path) -> int:
    path = tmp_path / "compiles"
    return len(path.read_text().splitlines()) if path.exists() else 0


# ---------------------------------------------------------------- keys


def test_key_is_stable_across_calls_and_processes(tmp_path: Path) -> None:
    key = kernel_key(KERNEL, "nvrtc")
    assert key == kernel_key(KERNEL, "nvrtc") and len(key) == 64
    assert _spawn_children("key", 2, tmp_path) == [{"key": key}] * 2


def test_key_ignores_cache_dir_and_include_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = compile_kernel(KERNEL).key
    assert compile_kernel(KERNEL, cache_dir=tmp_path / "elsewhere").key == key
    for copy in (tmp_path / "a" / "include", tmp_path / "b" / "c" / "include"):
        shutil.copytree(include_dir(), copy)
        monkeypatch.setenv("DEEPGEMM_INCLUDE_DIR", str(copy))
        assert kernel_key(KERNEL, "nvrtc") == key


def test_key_follows_header_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "include"
    (root / "deepgemm" / "ptx").mkdir(parents=True)
    header = root / "deepgemm" / "ptx" / "a.cuh"
    header.write_text("#pragma once\n")
    monkeypatch.setenv("DEEPGEMM_INCLUDE_DIR", str(root))
    keys = {kernel_key(KERNEL, "nvrtc")}
    for edit in (
        lambda: header.write_text("#pragma once\n// edited\n"),
        lambda: header.rename(header.with_name("b.cuh")),
        lambda: (root / "deepgemm" / "c.cuh").write_text(""),
    ):
        edit()
        tree_digest.cache_clear()  # the digest is memoized per process
        keys.add(kernel_key(KERNEL, "nvrtc"))
    assert len(keys) == 4


def test_key_follows_source_entry_compiler_and_options(monkeypatch: pytest.MonkeyPatch) -> None:
    base = kernel_key(KERNEL, "nvrtc")
    assert kernel_key(KernelSource(code=KERNEL.code + "\n"), "nvrtc") != base
    assert kernel_key(KernelSource(code=KERNEL.code, entry="other"), "nvrtc") != base
    assert kernel_key(KernelSource(code=KERNEL.code, label="renamed"), "nvrtc") == base
    if shutil.which("nvcc"):
        assert kernel_key(KERNEL, "nvcc") != base
    monkeypatch.setattr(compiler, "NVRTC_OPTIONS", (*compiler.NVRTC_OPTIONS, "-DEXTRA=1"))
    assert kernel_key(KERNEL, "nvrtc") != base


def test_cache_key_fields_are_delimited() -> None:
    common: dict[str, Any] = {
        "entry": "k", "compiler": "nvrtc", "compiler_version": "13.5", "header_digest": "0",
    }
    assert cache_key(source="ab", options=["c"], **common) != cache_key(
        source="a", options=["bc"], **common
    )
    assert cache_key(source="a", options=["b", "c"], **common) != cache_key(
        source="a", options=["bc"], **common
    )


# ---------------------------------------------------------------- hits


def test_layout_and_meta(private_cache: Path) -> None:
    kernel = compile_kernel(KERNEL)
    entry = private_cache / "kernels" / kernel.key[:2] / kernel.key
    assert kernel.cubin_path == entry / "kernel.cubin"
    assert (entry / "kernel.cu").read_text() == KERNEL.code
    assert (private_cache / "locks" / f"{kernel.key}.lock").exists()
    assert list((private_cache / "tmp").iterdir()) == []
    meta = json.loads((entry / "meta.json").read_text())
    cubin = kernel.cubin_path.read_bytes()
    assert meta["cubin_sha256"] == hashlib.sha256(cubin).hexdigest()
    assert meta["cubin_size"] == len(cubin)
    assert meta["layout"] == LAYOUT_VERSION and meta["key"] == kernel.key
    assert meta["entry"] == "deepgemm_kernel" and meta["label"] == KERNEL.label
    assert meta["resources"]["registers"] > 0 and meta["log"] == kernel.log
    assert str(include_dir()) in " ".join(meta["options"])


def test_second_compile_is_a_hit_without_a_compiler(compiles: list[str]) -> None:
    first = compile_kernel(KERNEL)
    assert compiles == ["NVRTC worker"]
    assert compile_kernel(KERNEL) is first  # memo
    compiler._memo.clear()
    again = compile_kernel(KernelSource(code=KERNEL.code, label="same code"))  # disk
    assert compiles == ["NVRTC worker"]
    assert again.cubin_path == first.cubin_path and again.resources == first.resources


def test_hit_from_a_fresh_process(tmp_path: Path) -> None:
    key = compile_kernel(KernelSource(code=KERNEL.code)).key
    (reply,) = _spawn_children("forbid", 1, tmp_path)
    assert reply["key"] == key


def test_cache_dir_is_created_and_home_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    deep = tmp_path / "a" / "b" / "c"
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(deep))
    assert compile_kernel(KERNEL).cubin_path.is_relative_to(deep)
    assert list(home.iterdir()) == []


def test_failed_compile_publishes_nothing(private_cache: Path) -> None:
    with pytest.raises(CompileError):
        compile_kernel(KernelSource(code="this is not C++"))
    assert list(private_cache.glob("kernels/*/*")) == []
    assert list((private_cache / "tmp").iterdir()) == []


def test_publish_yields_to_an_intact_entry(private_cache: Path) -> None:
    """Without a working lock a late publisher keeps the entry already there."""
    first = compile_kernel(KERNEL)
    cache = KernelCache(private_cache)
    with cache.locked(first.key):
        leftover = cache.staging_dir(first.key)
        young = cache.staging_dir(first.key)  # maybe another process's, where locks do nothing: kept
        old = time.time() - STALE_STAGING_S - 60
        os.utime(leftover, (old, old))
        staging = cache.staging_dir(first.key)
    assert not leftover.exists() and young.exists()
    shutil.rmtree(young)
    shutil.copy(first.cubin_path, staging / "kernel.cubin")
    entry = cache.publish(first.key, staging, {"log": "late"})
    assert entry.cubin_path == first.cubin_path and entry.meta["log"] == first.log
    assert list((private_cache / "tmp").iterdir()) == []


# ---------------------------------------------------------------- races and damage


def test_eight_racing_processes_compile_once(tmp_path: Path) -> None:
    replies = _spawn_children("count", 8, tmp_path)
    assert _compile_count(tmp_path) == 1
    assert len({r["key"] for r in replies}) == 1
    assert len({r["sha"] for r in replies}) == 1
    assert {r["magic"] for r in replies} == {b"\x7fELF".hex()}
    assert KernelCache(Path(os.environ["DEEPGEMM_CACHE_DIR"])).load(replies[0]["key"])


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda entry: _truncate(entry / "kernel.cubin"),
        lambda entry: _flip_last_byte(entry / "kernel.cubin"),
        lambda entry: (entry / "kernel.cubin").unlink(),
        lambda entry: (entry / "meta.json").write_text("{ not json"),
        lambda entry: (entry / "meta.json").write_text("[]"),
        lambda entry: (entry / "meta.json").unlink(),
    ],
    ids=["truncated", "bad-sha", "no-cubin", "garbled-meta", "meta-not-object", "no-meta"],
)
def test_corrupted_entry_is_recompiled(
    damage: Callable[[Path], None], compiles: list[str]
) -> None:
    first = compile_kernel(KERNEL)
    good = first.cubin_path.read_bytes()
    damage(first.cubin_path.parent)
    cache = KernelCache(Path(os.environ["DEEPGEMM_CACHE_DIR"]))
    assert cache.load(first.key) is None
    compiler._memo.clear()
    again = compile_kernel(KERNEL)
    assert compiles == ["NVRTC worker", "NVRTC worker"]
    assert again.cubin_path.read_bytes() == good
    assert cache.load(first.key) is not None


def test_digest_follows_symlinked_folders(tmp_path: Path) -> None:
    """rglob did not enter a symlinked folder, so its headers (which the compiler does read) were not in the key:
    an edited header was served from the old cubin."""
    real, root = tmp_path / "real", tmp_path / "include"
    real.mkdir()
    root.mkdir()
    (real / "a.cuh").write_text("// one")
    (root / "deepgemm").symlink_to(real, target_is_directory=True)
    tree_digest.cache_clear()
    before = tree_digest(root)
    (real / "a.cuh").write_text("// two")
    tree_digest.cache_clear()
    assert tree_digest(root) != before
    assert before != hashlib.sha256().hexdigest()  # not the digest of nothing
    tree_digest.cache_clear()


def test_an_entry_that_cannot_be_read_is_not_thrown_away(private_cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A permission (or EIO) error reading an intact entry counted as damage: the entry was discarded and
    recompiled. It is a CacheError naming the entry; a missing or bad entry is still a miss."""
    first = compile_kernel(KERNEL)
    real = Path.read_bytes

    def denied(path: Path) -> bytes:
        if path.name == "meta.json":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(CacheError, match="read the cache entry"):
        KernelCache(private_cache).load(first.key)
    monkeypatch.undo()
    assert first.cubin_path.is_file()
