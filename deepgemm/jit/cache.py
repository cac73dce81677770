"""Content-addressed on-disk cache of compiled kernels.

Layout under the cache root::

    kernels/<key[:2]>/<key>/{kernel.cubin, kernel.cu, meta.json}
    locks/<key>.lock      per-key fcntl.flock lock files (kept)
    tmp/                  staging dirs, renamed atomically into kernels/

Every filesystem failure of the cache (a read-only or full dir, a file where one of these folders should be)
raises deepgemm.CacheError naming the path and the cause; reads of a damaged entry just miss.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepgemm.errors import CacheError, LockTimeoutError

#: Bump when the key recipe or the entry layout changes.
LAYOUT_VERSION = 1
CUBIN_NAME = "kernel.cubin"
STALE_STAGING_S = 24 * 3600.0  # a staging directory this old belongs to no live compile
SOURCE_NAME = "kernel.cu"
META_NAME = "meta.json"
ELF_MAGIC = b"\x7fELF"


@functools.cache
def tree_digest(root: Path) -> str:
    """sha256 over every file under ``root``: relative path and content, sorted. Symlinked folders are followed,
    as the compiler follows them when it resolves an include.

    Memoized per process; call ``tree_digest.cache_clear()`` after editing files.
    """
    files = sorted(
        ((Path(folder) / name).relative_to(root).as_posix(), Path(folder) / name)
        for folder, _, names in os.walk(root, followlinks=True) for name in names
        if (Path(folder) / name).is_file()
    )
    h = hashlib.sha256()
    for rel, path in files:
        _feed(h, [rel.encode(), path.read_bytes()])
    return h.hexdigest()


def cache_key(
    *,
    source: str,
    entry: str,
    compiler: str,
    compiler_version: str,
    options: Iterable[str],
    header_digest: str,
) -> str:
    """sha256 hex key of everything that determines the cubin.

    ``options`` must hold no absolute paths (use placeholders) so that the key
    does not depend on where the package or the cache lives.
    """
    h = hashlib.sha256()
    _feed(h, [f"layout={LAYOUT_VERSION}".encode(), source.encode(), entry.encode()])
    _feed(h, [header_digest.encode(), compiler.encode(), compiler_version.encode()])
    _feed(h, [opt.encode() for opt in options])
    return h.hexdigest()


def _feed(h: Any, parts: Iterable[bytes]) -> None:
    """Length-prefix each part so that different splits never collide."""
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)


@dataclass(frozen=True)
class CacheEntry:
    """A published, validated cache entry."""

    key: str
    directory: Path
    meta: dict[str, Any]

    @property
    def cubin_path(self) -> Path:
        return self.directory / CUBIN_NAME


class KernelCache:
    """One cache root; all methods are safe to call from many processes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def entry_dir(self, key: str) -> Path:
        return self.root / "kernels" / key[:2] / key

    def load(self, key: str) -> CacheEntry | None:
        """The entry for ``key`` if present and intact; never modifies the cache."""
        directory = self.entry_dir(key)
        meta = _validated_meta(directory, key)
        return None if meta is None else CacheEntry(key, directory, meta)

    def exists(self, key: str) -> bool:
        return self.entry_dir(key).exists()

    @contextmanager
    def locked(self, key: str, *, timeout: float | None = None, what: str = "") -> Iterator[None]:
        """Hold the exclusive per-key lock.

        Waits at most ``timeout`` seconds (None: for ever), then raises LockTimeoutError naming the lock file,
        ``what`` (the kernel) and the key. CacheError if the lock file cannot be created.
        """
        path = self.root / "locks" / f"{key}.lock"
        make_dirs(path.parent)
        with cache_errors("create the lock file", path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _flock(fd, path, timeout, f"{what} (key {key})" if what else f"key {key}")
            yield
        finally:
            os.close(fd)

    def staging_dir(self, key: str) -> Path:
        """A fresh directory on the cache's filesystem (call with the key's lock held).

        Leftovers of this key from killed processes are removed first: those older than any live compile can be
        (where file locks do nothing, e.g. NFS without locking, a younger one may be another process's staging).
        """
        tmp = self.root / "tmp"
        make_dirs(tmp)
        with cache_errors("create the staging directory", tmp):
            horizon = time.time() - STALE_STAGING_S
            for stale in tmp.glob(f"{key}-*"):
                try:
                    if stale.stat().st_mtime < horizon:
                        shutil.rmtree(stale, ignore_errors=True)
                except FileNotFoundError:
                    pass
            return Path(tempfile.mkdtemp(prefix=f"{key}-", dir=tmp))

    def discard(self, key: str) -> None:
        """Remove the entry for ``key`` (call with the key's lock held)."""
        directory = self.entry_dir(key)
        if not directory.exists():
            return
        trash = self.staging_dir(key)
        with cache_errors("move aside the damaged entry", directory):
            os.rename(directory, trash / "old")
        shutil.rmtree(trash, ignore_errors=True)

    def publish(self, key: str, staging: Path, meta: dict[str, Any]) -> CacheEntry:
        """Record the cubin's hash in meta.json, validate, and move into place.

        ``staging`` must come from :meth:`staging_dir` and hold kernel.cubin;
        call with the key's lock held. Raises ValueError if the cubin is bad,
        CacheError if the filesystem fails (e.g. ENOSPC writing meta.json).
        If an intact entry appeared meanwhile, that one is returned.
        """
        with cache_errors("read the staged cubin", staging / CUBIN_NAME):
            cubin = (staging / CUBIN_NAME).read_bytes()
        if not cubin.startswith(ELF_MAGIC):
            raise ValueError(f"compiler output is not an ELF cubin ({len(cubin)} bytes)")
        meta = {
            **meta,
            "layout": LAYOUT_VERSION,
            "key": key,
            "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
            "cubin_size": len(cubin),
        }
        with cache_errors("write", staging / META_NAME):
            _write_synced(staging / META_NAME, json.dumps(meta, indent=1).encode())
        with cache_errors("sync", staging / CUBIN_NAME):
            _fsync_file(staging / CUBIN_NAME)
        if _validated_meta(staging, key) is None:
            raise ValueError("staged cache entry failed validation")
        final = self.entry_dir(key)
        make_dirs(final.parent)
        try:
            os.rename(staging, final)
        except OSError as exc:
            # Someone published without our lock (e.g. flock is a no-op on
            # this filesystem); an intact entry there is as good as ours.
            existing = self.load(key)
            if existing is None:
                raise CacheError.from_os_error("rename the staged entry into kernels/:", staging, exc) from exc
            shutil.rmtree(staging, ignore_errors=True)
            return existing
        return CacheEntry(key, final, meta)


@contextmanager
def cache_errors(action: str, path: Path) -> Iterator[None]:
    """Turn an OSError raised inside into a CacheError for ``action`` on ``path`` (or the exception's own
    filename, where it names one)."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, CacheError):
            raise
        raise CacheError.from_os_error(action, path, exc) from exc


def make_dirs(path: Path) -> None:
    """``mkdir -p path``; a CacheError names the component that failed (ENOTDIR for a file in the way)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # path is not a directory (pathlib re-raises EEXIST then)
        raise CacheError("create the directory", path, errno.ENOTDIR,
                         "a file of that name is in the way") from exc
    except OSError as exc:
        raise CacheError.from_os_error("create the directory", path, exc) from exc


def _flock(fd: int, path: Path, timeout: float | None, what: str) -> None:
    """flock(LOCK_EX) on ``fd``, polling for at most ``timeout`` seconds (None: block)."""
    try:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return
        deadline, delay = time.monotonic() + timeout, 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LockTimeoutError(
                    f"deepgemm kernel cache: timed out after {timeout:g} s waiting for the lock {path} of {what}: "
                    "another process is compiling this kernel, or hangs holding the lock (the wait is "
                    "DEEPGEMM_COMPILE_TIMEOUT plus a margin; find the holder with `fuser` on the lock file)"
                )
            time.sleep(min(delay, remaining))
            delay = min(2 * delay, 0.05)
    except OSError as exc:
        if isinstance(exc, LockTimeoutError):
            raise
        raise CacheError.from_os_error("lock", path, exc) from exc


def _validated_meta(directory: Path, key: str) -> dict[str, Any] | None:
    """meta.json of ``directory`` if it and the cubin it describes are intact; None if either is missing or damaged.
    Another read error (permissions, EIO, EMFILE) raises CacheError: the entry may be intact, so it is not thrown
    away as damaged."""
    try:
        meta = json.loads((directory / META_NAME).read_bytes())
        cubin = (directory / CUBIN_NAME).read_bytes()
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    except OSError as exc:
        raise CacheError.from_os_error("read the cache entry", directory, exc) from exc
    if not isinstance(meta, dict):
        return None
    ok = (
        meta.get("layout") == LAYOUT_VERSION
        and meta.get("key") == key
        and meta.get("cubin_size") == len(cubin)
        and cubin.startswith(ELF_MAGIC)
        and meta.get("cubin_sha256") == hashlib.sha256(cubin).hexdigest()
    )
    return meta if ok else None


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
