"""Content-addressed on-disk cache of compiled kernels.

Layout under the cache root::

    kernels/<key[:2]>/<key>/{kernel.cubin, kernel.cu, meta.json}
    locks/<key>.lock      per-key fcntl.flock lock files (kept)
    tmp/                  staging dirs, renamed atomically into kernels/
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Bump when the key recipe or the entry layout changes.
LAYOUT_VERSION = 1
CUBIN_NAME = "kernel.cubin"
SOURCE_NAME = "kernel.cu"
META_NAME = "meta.json"
ELF_MAGIC = b"\x7fELF"


@functools.cache
def tree_digest(root: Path) -> str:
    """sha256 over every file under ``root``: relative path and content, sorted.

    Memoized per process; call ``tree_digest.cache_clear()`` after editing files.
    """
    files = sorted(
        (p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file()
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
    def locked(self, key: str) -> Iterator[None]:
        """Hold the exclusive per-key lock (blocks until available)."""
        path = self.root / "locks" / f"{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def staging_dir(self, key: str) -> Path:
        """A fresh directory on the cache's filesystem (call with the key's lock held).

        Leftovers of this key from killed processes are removed first.
        """
        tmp = self.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        for stale in tmp.glob(f"{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix=f"{key}-", dir=tmp))

    def discard(self, key: str) -> None:
        """Remove the entry for ``key`` (call with the key's lock held)."""
        directory = self.entry_dir(key)
        if not directory.exists():
            return
        trash = self.staging_dir(key)
        os.rename(directory, trash / "old")
        shutil.rmtree(trash, ignore_errors=True)

    def publish(self, key: str, staging: Path, meta: dict[str, Any]) -> CacheEntry:
        """Record the cubin's hash in meta.json, validate, and move into place.

        ``staging`` must come from :meth:`staging_dir` and hold kernel.cubin;
        call with the key's lock held. Raises ValueError if the cubin is bad.
        If an intact entry appeared meanwhile, that one is returned.
        """
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
        _write_synced(staging / META_NAME, json.dumps(meta, indent=1).encode())
        _fsync_file(staging / CUBIN_NAME)
        if _validated_meta(staging, key) is None:
            raise ValueError("staged cache entry failed validation")
        final = self.entry_dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staging, final)
        except OSError:
            # Someone published without our lock (e.g. flock is a no-op on
            # this filesystem); an intact entry there is as good as ours.
            existing = self.load(key)
            if existing is None:
                raise
            shutil.rmtree(staging, ignore_errors=True)
            return existing
        return CacheEntry(key, final, meta)


def _validated_meta(directory: Path, key: str) -> dict[str, Any] | None:
    """meta.json of ``directory`` if it and the cubin it describes are intact."""
    try:
        meta = json.loads((directory / META_NAME).read_bytes())
        cubin = (directory / CUBIN_NAME).read_bytes()
    except (OSError, ValueError):
        return None
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
