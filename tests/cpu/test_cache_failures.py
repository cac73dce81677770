"""Cache failures (issue 25, point 6): a cache dir that cannot be written, is full, or has a file where one of its
folders should be raises one deepgemm.CacheError; the memo never hands out a deleted cubin; an NVRTC worker dies
with its caller; kernel loads lock per key, with timeouts that name the kernel. No GPU."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import deepgemm
from deepgemm.errors import CacheError, CompileError, DeepGemmError, LockTimeoutError
from deepgemm.jit import cache as cache_module
from deepgemm.jit import compiler
from deepgemm.jit.cache import KernelCache
from deepgemm.jit.compiler import CompiledKernel, KernelSource, compile_kernel
from tests.cpu.test_jit_cache import compiles, nvrtc_and_package_headers  # noqa: F401 (fixtures; the second autouse)
from tests.cpu.test_jit_compiler import private_cache, shared_nvrtc_headers  # noqa: F401 (fixtures)

KERNEL = KernelSource(
    code='extern "C" __global__ void deepgemm_kernel(int* out) { out[threadIdx.x] = threadIdx.x; }',
    label="cache failure test kernel",
)
REPO_ROOT = Path(compiler.__file__).resolve().parents[2]


def _assert_cache_error(exc: BaseException, path: Path, code: int) -> None:
    """One typed error: an OSError and a DeepGemmError, never a CompileError, naming path, cause and the fix."""
    assert type(exc) is CacheError, repr(exc)
    assert isinstance(exc, OSError) and isinstance(exc, DeepGemmError) and not isinstance(exc, CompileError)
    assert exc.errno == code and exc.filename == str(path)
    message = str(exc)
    assert str(path) in message and errno.errorcode[code] in message
    assert "set DEEPGEMM_CACHE_DIR to move the cache" in message


def _nothing_published(root: Path) -> None:
    assert list(root.glob("kernels/*/*")) == []
    assert not (root / "tmp").is_dir() or list((root / "tmp").iterdir()) == []


# ---------------------------------------------------------------- the error type


def test_cache_error_type_and_message() -> None:
    assert deepgemm.CacheError is CacheError and "CacheError" in deepgemm.__all__
    assert issubclass(CacheError, OSError) and issubclass(CacheError, DeepGemmError)
    exc = CacheError("write", "/c/kernels/ab/x/meta.json", errno.ENOSPC, os.strerror(errno.ENOSPC))
    _assert_cache_error(exc, Path("/c/kernels/ab/x/meta.json"), errno.ENOSPC)
    assert "No space left on device" in str(exc)
    again = pickle.loads(pickle.dumps(exc))  # crosses process pools intact
    assert type(again) is CacheError and str(again) == str(exc) and again.errno == errno.ENOSPC
    assert issubclass(LockTimeoutError, TimeoutError) and issubclass(LockTimeoutError, DeepGemmError)


# ---------------------------------------------------------------- read-only, replaced and full


def _chmod_restricts(directory: Path) -> bool:
    """Whether a mode-0555 directory refuses new files here (it does not for root)."""
    probe = directory / "probe"
    probe.mkdir()
    probe.chmod(0o555)
    try:
        (probe / "file").touch()
    except PermissionError:
        return True
    finally:
        probe.chmod(0o755)
    return False


def _read_only(root: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Make ``root`` read-only: chmod where that restricts, else os.mkdir/os.open fail with EROFS under it.

    Returns the errno the cache should report.
    """
    root.mkdir(parents=True, exist_ok=True)
    if _chmod_restricts(root.parent):
        root.chmod(0o555)
        return errno.EACCES
    real_mkdir, real_open = os.mkdir, os.open
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def refuse(path: Any) -> None:
        if Path(os.fsdecode(path)).absolute().is_relative_to(root):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        refuse(path)
        real_mkdir(path, *args, **kwargs)

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & writes:
            refuse(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)
    return errno.EROFS


def test_read_only_cache_dir(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = _read_only(private_cache, monkeypatch)
    with pytest.raises(CacheError) as info:
        compile_kernel(KERNEL)
    _assert_cache_error(info.value, private_cache / "locks", code)


def test_read_only_cache_still_serves_its_entries(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch, compiles: list[str]
) -> None:
    first = compile_kernel(KERNEL)
    _read_only(private_cache, monkeypatch)
    compiler._memo.clear()
    assert compile_kernel(KERNEL).cubin_path == first.cubin_path
    assert compiles == ["NVRTC worker"]


@pytest.mark.parametrize("folder", ["locks", "tmp", "kernels"])
def test_folder_replaced_by_a_file(private_cache: Path, folder: str) -> None:
    private_cache.mkdir()
    (private_cache / folder).write_text("not a folder")
    with pytest.raises(CacheError) as info:
        compile_kernel(KERNEL)
    failed = Path(info.value.filename)
    assert failed == private_cache / folder or failed.parent == private_cache / folder
    _assert_cache_error(info.value, failed, errno.ENOTDIR)
    assert (private_cache / folder).read_text() == "not a folder"


def test_cache_root_is_a_file(private_cache: Path) -> None:
    private_cache.write_text("not a folder")
    with pytest.raises(CacheError) as info:
        compile_kernel(KERNEL)
    assert Path(info.value.filename).is_relative_to(private_cache)
    _assert_cache_error(info.value, Path(info.value.filename), errno.ENOTDIR)


def _full_file(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Staging dirs whose ``name`` is a link to /dev/full: writing it fails with a real ENOSPC."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    original = KernelCache.staging_dir

    def staging_dir(self: KernelCache, key: str) -> Path:
        staging: Path = original(self, key)
        (staging / name).symlink_to("/dev/full")
        return staging

    monkeypatch.setattr(KernelCache, "staging_dir", staging_dir)


@pytest.mark.parametrize(
    ("name", "stage"),
    [("meta.json", "publish"), ("kernel.cubin", "worker"), ("kernel.cu", "source")],
)
def test_full_disk_raises_cache_error_not_compile_error(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch, name: str, stage: str
) -> None:
    """ENOSPC while publishing, in the NVRTC worker writing the cubin, and writing the source."""
    _full_file(monkeypatch, name)
    with pytest.raises(OSError) as info:
        compile_kernel(KERNEL)
    _assert_cache_error(info.value, Path(info.value.filename), errno.ENOSPC)
    assert Path(info.value.filename).name == name, stage
    _nothing_published(private_cache)
    assert not (private_cache / "failed").exists()  # not a compiler failure: no source kept for it


def test_rename_failure_while_publishing(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def rename(src: Any, dst: Any) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), os.fsdecode(src), os.fsdecode(dst))

    monkeypatch.setattr(cache_module.os, "rename", rename)
    with pytest.raises(CacheError) as info:
        compile_kernel(KERNEL)
    assert Path(info.value.filename).parent == private_cache / "tmp"
    _assert_cache_error(info.value, Path(info.value.filename), errno.EXDEV)


# ---------------------------------------------------------------- deleted cubins behind the memos


@pytest.mark.parametrize("what", ["cubin", "entry", "cache"])
def test_memo_does_not_hand_out_a_deleted_cubin(
    private_cache: Path, compiles: list[str], what: str
) -> None:
    first = compile_kernel(KERNEL)
    good = first.cubin_path.read_bytes()
    if what == "cubin":
        first.cubin_path.unlink()
    else:
        import shutil

        shutil.rmtree(first.cubin_path.parent if what == "entry" else private_cache)
    again = compile_kernel(KERNEL)
    assert again.cubin_path.read_bytes() == good
    assert compiles == ["NVRTC worker", "NVRTC worker"]
    assert compile_kernel(KERNEL) is again  # and the memo works again


@pytest.fixture
def loader(monkeypatch: pytest.MonkeyPatch) -> Any:
    """deepgemm.kernels.common.loader with an empty memo and LoadedKernel faked (no driver): it records the
    cubin bytes it was given."""
    from deepgemm.kernels.common import loader as module

    class FakeLoaded:
        def __init__(self, cubin: bytes, entry: str, dynamic_smem_bytes: int) -> None:
            self.cubin, self.entry, self.dynamic_smem_bytes = cubin, entry, dynamic_smem_bytes

    monkeypatch.setattr(module, "LoadedKernel", FakeLoaded)
    monkeypatch.setattr(module, "_loaded", {})
    return module


def test_loader_recompiles_a_cubin_deleted_behind_the_memo(loader: Any, compiles: list[str]) -> None:
    first = compile_kernel(KERNEL)  # in the compile memo
    good = first.cubin_path.read_bytes()
    first.cubin_path.unlink()
    kernel = loader.load_kernel(KERNEL, 0)
    assert kernel.cubin == good and kernel.entry == "deepgemm_kernel"
    assert compiles == ["NVRTC worker", "NVRTC worker"]
    assert loader.load_kernel(KERNEL, 0) is kernel  # the loaded module stays valid


def test_loader_keeps_each_entry_of_a_source_apart(loader: Any) -> None:
    """One source may define several kernels: each entry loads its own kernel (the memo is keyed on the entry too)."""
    code = ('extern "C" __global__ void first_entry(int* p) { *p = 1; }\n'
            'extern "C" __global__ void second_entry(int* p) { *p = 2; }\n')
    first = loader.load_kernel(KernelSource(code, "first_entry"), 0)
    second = loader.load_kernel(KernelSource(code, "second_entry"), 0)
    assert (first.entry, second.entry) == ("first_entry", "second_entry")
    assert loader.load_kernel(KernelSource(code, "first_entry"), 0) is first


def test_loader_reports_a_vanished_cubin_as_cache_error(
    loader: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "gone" / "kernel.cubin"
    monkeypatch.setattr(loader, "compile_kernel", lambda source: CompiledKernel(gone, source.entry, "0" * 64, None, ""))
    with pytest.raises(CacheError) as info:
        loader.load_kernel(KERNEL, 0)
    _assert_cache_error(info.value, gone, errno.ENOENT)


# ---------------------------------------------------------------- the NVRTC worker dies with its caller

# Exponential inlining: NVRTC needs ~30 s for this, so the worker is surely still compiling when the caller dies.
SLOW_KERNEL = r"""
template <int N> __device__ __forceinline__ float f(float x) { return f<N - 1>(x * 1.0001f + N) * f<N - 2>(x - 0.5f); }
template <> __device__ __forceinline__ float f<0>(float x) { return x; }
template <> __device__ __forceinline__ float f<1>(float x) { return x + 1.0f; }
extern "C" __global__ void deepgemm_kernel(float* out) { out[threadIdx.x] = f<24>(out[threadIdx.x]); }
"""

# The caller: compile_kernel in a fresh interpreter, deepgemm/__init__ (and torch) bypassed.
CALLER = r"""
import os, sys, types
package = types.ModuleType("deepgemm")
package.__path__ = [os.path.join(os.environ["DEEPGEMM_TEST_ROOT"], "deepgemm")]
sys.modules["deepgemm"] = package
from deepgemm.jit import compiler
compiler.compile_kernel(compiler.KernelSource(code=sys.argv[1]))
"""


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie, which an init that does not reap leaves behind, counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_nvrtc_worker_dies_with_its_caller() -> None:
    env = {**os.environ, "DEEPGEMM_TEST_ROOT": str(REPO_ROOT)}
    caller = subprocess.Popen([sys.executable, "-c", CALLER, SLOW_KERNEL], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while worker is None and time.monotonic() < deadline and caller.poll() is None:
            for pid in _children(caller.pid):
                if "compile_worker.py" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    worker = pid
            time.sleep(0.05)
        assert worker is not None, caller.stderr.read().decode() if caller.poll() is not None else "no worker"
        time.sleep(0.5)  # the worker is compiling
        assert _alive(worker)
        caller.kill()
        caller.wait()
        deadline = time.monotonic() + 5
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "the NVRTC worker outlived its caller"
    finally:
        caller.kill()
        caller.wait()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_worker_started_after_its_caller_died_exits(tmp_path: Path) -> None:
    """The window before prctl: a worker whose recorded parent is gone exits at once, compiling nothing."""
    cubin = tmp_path / "kernel.cubin"
    request = {"source": KERNEL.code, "name": "kernel.cu", "options": ["--gpu-architecture=sm_90a"],
               "cubin_path": str(cubin), "cuda_include_dir": None}
    env = {**os.environ, "DEEPGEMM_WORKER_PARENT": "1"}  # not this process, the worker's real parent
    proc = subprocess.run(compiler.worker_command(), input=json.dumps(request), env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and proc.stdout == "" and not cubin.exists()
    del env["DEEPGEMM_WORKER_PARENT"]  # and the same request compiles from a live parent
    proc = subprocess.run(compiler.worker_command(), input=json.dumps(request), env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and cubin.read_bytes().startswith(b"\x7fELF")


# ---------------------------------------------------------------- per-key load locks and timeouts


def _threads(targets: list[Callable[[], None]]) -> Iterator[threading.Thread]:
    for target in targets:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        yield thread


def test_different_kernels_load_concurrently(loader: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    both_inside = threading.Barrier(2, timeout=10)

    def compile_(source: KernelSource) -> CompiledKernel:
        both_inside.wait()  # breaks (after 10 s) unless the two loads run at the same time
        return compile_kernel(source)

    monkeypatch.setattr(loader, "compile_kernel", compile_)
    sources = [KERNEL, KernelSource(code=KERNEL.code + "\n// other", label="other kernel")]
    results: dict[int, Any] = {}

    def load(index: int) -> None:
        try:
            results[index] = loader.load_kernel(sources[index], 0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[index] = exc

    for thread in list(_threads([lambda: load(0), lambda: load(1)])):
        thread.join(30)
    assert all(hasattr(results.get(i), "cubin") for i in (0, 1)), results


def test_same_kernel_loads_once(loader: Any, monkeypatch: pytest.MonkeyPatch, compiles: list[str]) -> None:
    results: list[Any] = []
    for thread in list(_threads([lambda: results.append(loader.load_kernel(KERNEL, 0))] * 6)):
        thread.join(60)
    assert len(results) == 6 and all(r is results[0] for r in results)
    assert compiles == ["NVRTC worker"]


def test_load_lock_timeout_names_the_kernel(loader: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    release, entered = threading.Event(), threading.Event()

    def stuck(source: KernelSource) -> CompiledKernel:
        entered.set()
        release.wait(30)
        return compile_kernel(source)

    monkeypatch.setattr(loader, "compile_kernel", stuck)
    monkeypatch.setattr(loader, "load_lock_timeout", lambda: 0.3)
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            loader.load_kernel(KERNEL, 1024)
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    (holder,) = _threads([lambda: loader.load_kernel(KERNEL, 1024)])
    try:
        assert entered.wait(10)
        start = time.monotonic()
        (second,) = _threads([waiter])
        second.join(10)
        assert not second.is_alive() and time.monotonic() - start < 5
    finally:
        release.set()
        holder.join(60)
    (exc,) = errors
    assert isinstance(exc, LockTimeoutError) and isinstance(exc, TimeoutError)
    message = str(exc)
    assert KERNEL.label in message and "0.3 s" in message and "1024" in message
    assert compiler.kernel_key(KERNEL, "nvrtc")[:16] in message


def test_disk_lock_timeout_names_the_key(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = compiler.kernel_key(KERNEL, "nvrtc")
    lock = private_cache / "locks" / f"{key}.lock"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # "another process" compiling it (flock conflicts across open files)
    monkeypatch.setattr(compiler, "lock_timeout", lambda: 0.3)
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            compile_kernel(KERNEL)
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    try:
        (thread,) = _threads([waiter])
        thread.join(10)
        assert not thread.is_alive()
    finally:
        os.close(fd)
    (exc,) = errors
    assert isinstance(exc, LockTimeoutError), repr(exc)
    message = str(exc)
    assert str(lock) in message and KERNEL.label in message and "0.3 s" in message
    assert compile_kernel(KERNEL).key == key  # released: the next call compiles


def test_disk_lock_still_serialises(private_cache: Path) -> None:
    cache = KernelCache(private_cache)
    order: list[str] = []

    def second() -> None:
        with cache.locked("k" * 64, timeout=10):
            order.append("second")

    with cache.locked("k" * 64, timeout=10):
        (thread,) = _threads([second])
        time.sleep(0.2)
        order.append("first")
    thread.join(10)
    assert order == ["first", "second"]
