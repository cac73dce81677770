"""Compile one kernel source to an sm_90a cubin, via a memo and the disk cache.

``compile_kernel`` looks up the in-process memo, then the disk cache, and only
then compiles (under the key's file lock) with NVRTC in a child process or with
nvcc. ``compile_stats`` counts the three outcomes. Needs no GPU, driver or torch.

A filesystem failure of the cache raises CacheError (never a CompileError that
hides an ENOSPC); waiting longer than ``lock_timeout()`` for another process's
compile of the same kernel raises LockTimeoutError.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from deepgemm.errors import CacheError, CompileError
from deepgemm.jit.cache import (
    CUBIN_NAME,
    SOURCE_NAME,
    CacheEntry,
    KernelCache,
    cache_errors,
    cache_key,
    tree_digest,
)
from deepgemm.jit.resources import PtxasResources, parse_ptxas_log
from deepgemm.env import env_flag

_PACKAGE_INCLUDE = Path(__file__).resolve().parent.parent / "include"
#: Stands for the include directory in option lists, so keys hold no paths.
INCLUDE_PLACEHOLDER = "${DEEPGEMM_INCLUDE}"
_INCLUDE_FLAG = f"-I{INCLUDE_PLACEHOLDER}"

NVRTC_OPTIONS: tuple[str, ...] = (
    "--gpu-architecture=sm_90a",
    "-std=c++17",
    "--device-int128",
    "-DNDEBUG",
    "--ptxas-options=-v",
    _INCLUDE_FLAG,
)
NVCC_OPTIONS: tuple[str, ...] = (
    "-cubin",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "-Xptxas",
    "-v",
    _INCLUDE_FLAG,
)
COMPILERS = ("nvrtc", "nvcc")
_DEFAULT_TIMEOUT_S = 600.0
#: Added to the compile timeout for a wait on a kernel's lock (the holder compiles, then publishes).
_LOCK_MARGIN_S = 60.0
_NO_LIMIT_S = 1e9  # a timeout at least this long is no limit (~31 years; subprocess and flock take None)
#: Environment of the NVRTC worker: its caller's pid, so that it exits if the caller died before it started.
WORKER_PARENT_ENV = "DEEPGEMM_WORKER_PARENT"


class _Failure(Exception):
    """A compile failed; turned into CompileError once the source is saved."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.message, self.log = message, log


@dataclass(frozen=True)
class KernelSource:
    """A fully rendered .cu translation unit and its extern "C" entry point."""

    code: str
    entry: str = "deepgemm_kernel"
    label: str = ""


@dataclass(frozen=True)
class CompiledKernel:
    """A cubin in the disk cache and what ptxas reported for its entry."""

    cubin_path: Path
    entry: str
    key: str
    resources: PtxasResources | None
    log: str


#: How one compile_kernel call was served (see compile_kernel_outcome).
Outcome = Literal["compiled", "disk", "memo"]


@dataclass(frozen=True)
class CompileStats:
    """How ``compile_kernel`` calls of this process ended: ``compiled`` ran NVRTC/nvcc and published a cubin into the
    disk cache, ``disk_hits`` found one there, ``memo_hits`` found the kernel in the in-process memo."""

    compiled: int = 0
    disk_hits: int = 0
    memo_hits: int = 0

    def __sub__(self, earlier: CompileStats) -> CompileStats:
        """The calls between two snapshots: ``compile_stats() - before``."""
        return CompileStats(self.compiled - earlier.compiled, self.disk_hits - earlier.disk_hits,
                            self.memo_hits - earlier.memo_hits)


class _EventCount:
    """A thread-safe count of one event whose ``tick`` is a single C call (itertools.count's ``__next__``, atomic
    under the GIL), so the memo-hit path takes no lock. Reading ticks it too; reads, serialised by a lock, are
    counted and subtracted."""

    def __init__(self) -> None:
        self._ticks = itertools.count()
        self.tick: Callable[[], int] = self._ticks.__next__
        self._reads = 0
        self._lock = threading.Lock()

    def value(self) -> int:
        with self._lock:
            events = next(self._ticks) - self._reads
            self._reads += 1
        return events


_compiles = _EventCount()
_disk_hits = _EventCount()
_memo_hits = _EventCount()


def compile_stats() -> CompileStats:
    """Process-wide counts of compiles, disk-cache hits and memo hits so far (diff two snapshots with ``-``)."""
    return CompileStats(_compiles.value(), _disk_hits.value(), _memo_hits.value())


# ---------------------------------------------------------------- settings


def include_dir() -> Path:
    """Root passed as ``-I``: ``DEEPGEMM_INCLUDE_DIR`` or the package's include/."""
    return _include_dir_from(os.environ.get("DEEPGEMM_INCLUDE_DIR"))


@functools.cache
def _include_dir_from(override: str | None) -> Path:
    return Path(override).absolute() if override else _PACKAGE_INCLUDE


def compiler_choice() -> str:
    """``DEEPGEMM_COMPILER``: "nvrtc" (default) or "nvcc"."""
    choice = os.environ.get("DEEPGEMM_COMPILER", "nvrtc").strip().lower() or "nvrtc"
    if choice not in COMPILERS:
        raise ValueError(f"DEEPGEMM_COMPILER={choice!r}; expected one of {COMPILERS}")
    return choice


def default_cache_dir() -> Path:
    """``DEEPGEMM_CACHE_DIR`` (a relative one taken from the working directory of the first use), else
    ~/.cache/deepgemm."""
    return _cache_dir_from(os.environ.get("DEEPGEMM_CACHE_DIR"), os.environ.get("HOME"))


@functools.cache
def _cache_dir_from(override: str | None, home: str | None) -> Path:
    del home  # part of the memo key only: Path.home() reads it
    return Path(override).expanduser().absolute() if override else Path.home() / ".cache" / "deepgemm"


def nvrtc_headers_dir(cache_root: Path) -> Path:
    """Where NVRTC's bundled CUDA headers are unpacked, per NVRTC version.

    ``DEEPGEMM_NVRTC_HEADERS_DIR`` or ``<cache_root>/nvrtc-include``.
    """
    base = os.environ.get("DEEPGEMM_NVRTC_HEADERS_DIR") or cache_root / "nvrtc-include"
    return Path(base) / ("%d.%d" % nvrtc_version())


def compile_timeout() -> float:
    """``DEEPGEMM_COMPILE_TIMEOUT`` in seconds (default 600): a positive number, or ``inf`` (no limit)."""
    raw = os.environ.get("DEEPGEMM_COMPILE_TIMEOUT", "")
    if not raw.strip():
        return _DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0:  # (nan too)
        raise ValueError(f"DEEPGEMM_COMPILE_TIMEOUT={raw!r}: expected a positive number of seconds, or inf for no "
                         "limit")
    return value


def finite_or_none(seconds: float) -> float | None:
    """A timeout for APIs that take None as "no limit" (subprocess, locks): None for inf or values past ~31 years,
    which those APIs cannot represent."""
    return seconds if seconds < _NO_LIMIT_S else None


def lock_timeout() -> float:
    """How long to wait for a kernel's disk-cache lock, held by another process compiling the same kernel:
    ``compile_timeout()`` plus a margin, after which the holder's compile has been abandoned anyway."""
    return compile_timeout() + _LOCK_MARGIN_S


def _debug(message: str) -> None:
    if env_flag("DEEPGEMM_JIT_DEBUG"):
        print(f"[deepgemm.jit] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- compiler versions


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC that cuda.bindings loads."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise CompileError(f"NVRTC is unavailable (cuda.bindings): {exc}") from exc
    _, major, minor = nvrtc.nvrtcVersion()
    return int(major), int(minor)


def nvcc_binary() -> str:
    """``DEEPGEMM_NVCC`` (which must then be an executable), else nvcc on PATH, else /usr/local/cuda/bin/nvcc."""
    return _find_nvcc(os.environ.get("DEEPGEMM_NVCC"), os.environ.get("PATH"))


@functools.cache
def _find_nvcc(override: str | None, search_path: str | None) -> str:
    if override:  # named: that binary or an error, never another nvcc in its place
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise CompileError(f"DEEPGEMM_NVCC={override!r} is not an executable file")
    for candidate in (
        shutil.which("nvcc", path=search_path),
        "/usr/local/cuda/bin/nvcc",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise CompileError("nvcc not found (set DEEPGEMM_NVCC or put nvcc on PATH)")


@functools.cache
def _nvcc_version_text(binary: str) -> str:
    timeout = compile_timeout()
    try:
        proc = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=finite_or_none(timeout))
    except subprocess.TimeoutExpired:
        raise CompileError(f"{binary} --version did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise CompileError(f"{binary} --version could not run: {exc}") from exc
    if proc.returncode != 0:
        raise CompileError(f"{binary} --version failed", proc.stdout + proc.stderr)
    return proc.stdout.strip()


def compiler_version(compiler: str) -> str:
    """Version text that goes into the cache key (NVRTC: major.minor and, where a wheel installed it, the wheel's
    full version: patch releases change code generation)."""
    if compiler == "nvrtc":
        build = _nvrtc_wheel_version()
        return "nvrtc %d.%d" % nvrtc_version() + (f" ({build})" if build else "")
    return _nvcc_version_text(nvcc_binary())


@functools.cache
def _nvrtc_wheel_version() -> str:
    """The installed NVRTC wheel's version (e.g. 13.5.37), or "" (NVRTC from a toolkit)."""
    from importlib import metadata

    for name in ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ""


# ---------------------------------------------------------------- keys and the entry point

#: (source, compiler, cache root, include root) -> kernel. Equivalent to a
#: memo on the content key (headers and compiler versions are fixed per
#: process) but a hit costs a str hash instead of a sha256.
_memo: dict[tuple[KernelSource, str, Path, Path], CompiledKernel] = {}


def options_template(compiler: str) -> tuple[str, ...]:
    """The option list with INCLUDE_PLACEHOLDER in place of the include path."""
    return NVRTC_OPTIONS if compiler == "nvrtc" else NVCC_OPTIONS


def kernel_key(source: KernelSource, compiler: str) -> str:
    """Cache key of ``source`` for ``compiler`` (see cache.cache_key)."""
    return cache_key(
        source=source.code,
        entry=source.entry,
        compiler=compiler,
        compiler_version=compiler_version(compiler),
        options=options_template(compiler),
        header_digest=tree_digest(include_dir()),
    )


def compile_kernel(
    source: KernelSource, *, compiler: str | None = None, cache_dir: Path | None = None
) -> CompiledKernel:
    """Return the cubin for ``source``: memo, else disk cache, else compile.

    A memo hit whose cubin was deleted meanwhile (one stat) goes to the disk cache again, so a returned
    ``cubin_path`` existed when it was returned. Raises CompileError, CacheError or LockTimeoutError.
    """
    return compile_kernel_outcome(source, compiler=compiler, cache_dir=cache_dir)[0]


def compile_kernel_outcome(
    source: KernelSource, *, compiler: str | None = None, cache_dir: Path | None = None
) -> tuple[CompiledKernel, Outcome]:
    """``compile_kernel``, and how this call was served: "compiled" (NVRTC/nvcc ran now), "disk" (the disk cache
    held the cubin) or "memo" (this process had it), the outcome compile_stats counts, per call."""
    compiler = compiler or compiler_choice()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    memo_key = (source, compiler, root, include_dir())
    kernel = _memo.get(memo_key)
    if kernel is None or not os.path.isfile(kernel.cubin_path):
        if compiler not in COMPILERS:
            raise ValueError(f"unknown compiler {compiler!r}; expected one of {COMPILERS}")
        key = kernel_key(source, compiler)
        kernel, outcome = _load_or_compile(source, compiler, key, KernelCache(root))
        _memo[memo_key] = kernel
        return kernel, outcome
    _memo_hits.tick()
    return kernel, "memo"


def _load_or_compile(
    source: KernelSource, compiler: str, key: str, cache: KernelCache
) -> tuple[CompiledKernel, Outcome]:
    label = source.label or source.entry
    outcome: Outcome = "disk"
    entry = cache.load(key)
    if entry is None:
        with cache.locked(key, timeout=finite_or_none(lock_timeout()), what=repr(label)):
            entry = cache.load(key)  # another process may have published it
            if entry is None:
                if cache.exists(key):
                    _debug(f"discarding corrupted cache entry {key} ({label})")
                    cache.discard(key)
                entry = _compile_into_cache(source, compiler, key, cache)
                _compiles.tick()
                outcome = "compiled"
            else:
                _disk_hits.tick()
    else:
        _disk_hits.tick()
        _debug(f"disk cache hit {key[:16]} ({label})")
    kernel = _to_kernel(entry, source.entry)
    if env_flag("DEEPGEMM_PTXAS_VERBOSE"):
        print(f"[deepgemm.jit] ptxas log for {label}:\n{kernel.log}", file=sys.stderr)
    return kernel, outcome


def _to_kernel(entry: CacheEntry, entry_name: str) -> CompiledKernel:
    raw = entry.meta.get("resources")
    try:
        resources = PtxasResources.from_json(raw) if isinstance(raw, dict) else None
    except (KeyError, TypeError, ValueError):
        resources = None
    return CompiledKernel(
        cubin_path=entry.cubin_path,
        entry=entry_name,
        key=entry.key,
        resources=resources,
        log=str(entry.meta.get("log", "")),
    )


# ---------------------------------------------------------------- compiling


def _compile_into_cache(
    source: KernelSource, compiler: str, key: str, cache: KernelCache
) -> CacheEntry:
    """Compile into a staging dir and publish it; call with the key's lock held."""
    where = f"{source.label or source.entry!r} (key {key[:16]})"
    include = str(include_dir())
    options = [opt.replace(INCLUDE_PLACEHOLDER, include) for opt in options_template(compiler)]
    staging = cache.staging_dir(key)
    try:
        with cache_errors("write", staging / SOURCE_NAME):
            (staging / SOURCE_NAME).write_text(source.code)
        _debug(f"compiling {where} with {compiler}: {' '.join(options)}")
        start = time.perf_counter()
        run = _run_nvrtc if compiler == "nvrtc" else _run_nvcc
        log, used_options = run(source.code, options, staging, cache.root, where)
        seconds = time.perf_counter() - start
        _debug(f"compiled {where} in {seconds:.2f} s")
        _check_entry_symbol(staging / CUBIN_NAME, source.entry, where, log)
        resources = parse_ptxas_log(log, source.entry)
        meta = {
            "entry": source.entry,
            "label": source.label,
            "compiler": compiler,
            "compiler_version": compiler_version(compiler),
            "options": used_options,
            "resources": resources.to_json() if resources else None,
            "compile_seconds": round(seconds, 3),
            "created": time.time(),
            "log": log,
        }
        try:
            return cache.publish(key, staging, meta)  # a filesystem failure raises CacheError
        except ValueError as exc:
            raise _Failure(f"could not cache the cubin of {where}: {exc}", log) from exc
    except _Failure as failure:
        kept = _keep_failed_source(cache.root / "failed" / f"{key}.cu", source.code)
        raise CompileError(f"{failure.message}\nsource: {kept}", failure.log) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_entry_symbol(cubin: Path, entry: str, where: str, log: str) -> None:
    """Fail early (not at module load) when the entry function is missing."""
    try:
        data = cubin.read_bytes()
    except FileNotFoundError as exc:
        raise _Failure(f"no cubin was written for {where}: {exc}", log) from exc
    except OSError as exc:
        raise CacheError.from_os_error("read the compiled cubin", cubin, exc) from exc
    if f".text.{entry}\0".encode() not in data:
        raise _Failure(
            f"entry {entry!r} is not in the cubin of {where}; "
            'is it declared extern "C" __global__?',
            log,
        )


def _keep_failed_source(path: Path, code: str) -> str:
    """Save a source that failed to compile; return where (or why not)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    except OSError as exc:
        return f"not saved ({exc})"
    return str(path)


def worker_command() -> list[str]:
    """argv of the out-of-process NVRTC worker.

    Runs the file rather than ``-m deepgemm.jit.compile_worker`` so that the
    child does not import the deepgemm package (and torch with it).
    """
    return [sys.executable, str(Path(__file__).with_name("compile_worker.py"))]


_OTHER_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](?!deepgemm/)', re.M)


def _includes_other_headers(code: str) -> bool:
    """Whether ``code`` includes a header other than deepgemm's own (CUDA's, CCCL's: from NVRTC's bundle)."""
    return _OTHER_INCLUDE.search(code) is not None


def _run_nvrtc(
    code: str, options: list[str], staging: Path, cache_root: Path, where: str
) -> tuple[str, list[str]]:
    """Compile in a child worker; return (log, options used)."""
    request = {
        "source": code,
        "name": SOURCE_NAME,
        "options": options,
        "cubin_path": str(staging / CUBIN_NAME),
        # deepgemm's own headers need no CUDA headers; only sources that include one pay for
        # unpacking NVRTC's bundled headers (~26 MB, once per NVRTC version).
        "cuda_include_dir": str(nvrtc_headers_dir(cache_root)) if _includes_other_headers(code) else None,
    }
    proc = _run_process(worker_command(), "NVRTC worker", where, stdin=json.dumps(request))
    reply = _worker_reply(proc.stdout)
    if proc.returncode == 0 and reply is not None and reply.get("ok"):
        return str(reply["log"]), list(reply["options"])
    if reply is not None and reply.get("status") == "WRITE_FAILED":  # e.g. ENOSPC: the cache's failure
        number = reply.get("errno")
        raise CacheError("write", str(reply.get("path") or request["cubin_path"]),
                         number if isinstance(number, int) else None, str(reply.get("strerror") or "") or None)
    if reply is not None and not reply.get("ok"):
        status = reply.get("status")
        raise _Failure(f"NVRTC failed ({status}) to compile {where}", str(reply["log"]))
    raise _Failure(
        f"NVRTC worker exited with status {proc.returncode} compiling {where}",
        proc.stderr + proc.stdout,
    )


def _worker_reply(stdout: str) -> dict[str, Any] | None:
    """The JSON reply on the worker's last stdout line, if there is one."""
    lines = stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return reply if isinstance(reply, dict) and "log" in reply else None


def _run_nvcc(
    code: str, options: list[str], staging: Path, cache_root: Path, where: str
) -> tuple[str, list[str]]:
    """Compile ``staging/kernel.cu`` with nvcc; return (log, argv used)."""
    del code, cache_root  # the source is already in staging
    argv = [nvcc_binary(), *options, "-o", str(staging / CUBIN_NAME), str(staging / SOURCE_NAME)]
    proc = _run_process(argv, "nvcc", where)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise _Failure(f"nvcc failed (exit {proc.returncode}) to compile {where}", log)
    return log, argv


def _run_process(
    argv: Sequence[str],
    what: str,
    where: str,
    *,
    stdin: str = "",
) -> subprocess.CompletedProcess[str]:
    """Run a compiler process in its own session; _Failure on timeout or signal.

    The whole process group is killed on timeout or when the caller is
    interrupted, so no ptxas/cicc grandchild is left behind. The NVRTC worker
    also dies with its caller (compile_worker sets PR_SET_PDEATHSIG, and exits
    at once if ``WORKER_PARENT_ENV`` is no longer its parent).
    """
    timeout = compile_timeout()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
            env={**os.environ, WORKER_PARENT_ENV: str(os.getpid())},
        )
    except OSError as exc:
        raise _Failure(f"could not start {what} for {where}: {exc}") from exc
    with proc:
        try:
            stdout, stderr = proc.communicate(stdin, timeout=finite_or_none(timeout))
        except subprocess.TimeoutExpired:
            stdout, stderr = _kill_group(proc)
            raise _Failure(
                f"{what} timed out after {timeout:g} s compiling {where}", stderr + stdout
            ) from None
        except BaseException:
            _kill_group(proc)
            raise
    if proc.returncode < 0:
        raise _Failure(
            f"{what} died from {_signal_name(-proc.returncode)} compiling {where}",
            stderr + stdout,
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGKILL the child's process group; return what it had printed."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    stdout, stderr = proc.communicate()
    return stdout or "", stderr or ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
