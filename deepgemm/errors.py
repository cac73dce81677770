"""Exception types raised by deepgemm."""

from __future__ import annotations

import errno as _errno
import os


class DeepGemmError(RuntimeError):
    """Base class of deepgemm's own runtime errors."""


class CompileError(DeepGemmError):
    """A kernel failed to compile; ``log`` holds the compiler's output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(f"{message}\n--- compiler log ---\n{log}" if log else message)
        self.log = log


class UnsupportedError(DeepGemmError):
    """No path (kernel or fallback) can serve this call."""


class GraphCaptureError(DeepGemmError):
    """A kernel would need compiling or loading while a CUDA graph is being captured."""


class NotDifferentiableError(UnsupportedError):
    """An op without a backward was called on inputs that require grad, with grad mode on."""


class CacheError(DeepGemmError, OSError):
    """A filesystem operation on the kernel cache failed: a read-only or full cache dir, a file where one of its
    folders should be, a cubin that vanished.

    Both an ``OSError`` (``errno``, ``strerror`` and ``filename`` are those of the failure; ``except OSError``
    catches it) and a ``DeepGemmError`` (``except DeepGemmError`` catches every error of deepgemm's own). Never a
    ``CompileError``: the compiler did not fail. The message names the path, the cause and the way out::

        deepgemm kernel cache: cannot write /c/tmp/<key>-x/meta.json: No space left on device (ENOSPC);
        set DEEPGEMM_CACHE_DIR to move the cache
    """

    def __init__(self, action: str, path: str | os.PathLike[str], errno: int | None = None,
                 strerror: str | None = None) -> None:
        OSError.__init__(self, errno, strerror, os.fspath(path))
        self.action = action
        name = _errno.errorcode.get(errno) if errno is not None else None
        cause = f"{strerror} ({name})" if strerror and name else strerror or name or "unknown cause"
        self.message = (f"deepgemm kernel cache: cannot {action} {os.fspath(path)}: {cause}; "
                        "set DEEPGEMM_CACHE_DIR to move the cache")

    @classmethod
    def from_os_error(cls, action: str, path: str | os.PathLike[str], exc: OSError) -> CacheError:
        """The CacheError for ``exc``, an OSError met doing ``action`` on ``path`` (``exc.filename``, where set,
        names the exact path that failed)."""
        if isinstance(exc, CacheError):
            return exc
        return cls(action, exc.filename if isinstance(exc.filename, str) else path, exc.errno, exc.strerror)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type[CacheError], tuple[str, str, int | None, str | None]]:
        return type(self), (self.action, self.filename, self.errno, self.strerror)


class LockTimeoutError(DeepGemmError, TimeoutError):
    """Waiting for a kernel's lock (another thread or process compiling or loading the same kernel) took longer
    than the compile timeout allows; the message names the kernel and its key."""
