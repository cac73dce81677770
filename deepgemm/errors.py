"""Exception types raised by deepgemm."""

from __future__ import annotations

import errno as _errno
import os


class DeepGemmError(RuntimeError):
    """Base class of deepgemm's own runtime errors (a RuntimeError); argument errors are TypeError / ValueError.

    Raised by:
        Never itself: its subclasses CompileError, CacheError, LockTimeoutError, GraphCaptureError and
            UnsupportedError (with NotDifferentiableError) are.

    Example::

        try:
            y = deepgemm.fp8_gemm_nt(a, b)
        except deepgemm.DeepGemmError as exc:   # any failure of deepgemm's own, not a bad argument
            print("deepgemm failed:", exc)
    """


class CompileError(DeepGemmError):
    """A kernel failed to compile; ``log`` holds the compiler's output.

    Also raised when no compiler can run (NVRTC from cuda-bindings missing; nvcc not found with
    DEEPGEMM_COMPILER=nvcc) or a compile outlives DEEPGEMM_COMPILE_TIMEOUT.

    Raised by:
        The first call of a shape (GEMMs) or of an input dtype (quantizers) on the kernel path.
        precompile_fp8_gemm_nt, precompile_model, `deepgemm compile` and `deepgemm precompile` (no GPU needed).

    Example::

        try:
            deepgemm.precompile_fp8_gemm_nt(4096, 2112, 7168)
        except deepgemm.CompileError as exc:
            print(exc.log)
    """

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(f"{message}\n--- compiler log ---\n{log}" if log else message)
        self.log = log


class UnsupportedError(DeepGemmError):
    """No path (kernel or fallback) can serve this call.

    Raised by:
        The planners, when no tile configuration fits shared memory for a shape.
        `deepgemm tune` and the tuner (DEEPGEMM_AUTOTUNE=1) without an sm_90 GPU.

    Example::

        try:
            deepgemm.precompile_fp8_gemm_nt(4096, 2112, 7168)
        except deepgemm.UnsupportedError as exc:
            print("no kernel for this shape:", exc)
    """


class GraphCaptureError(DeepGemmError):
    """A kernel would need compiling or loading while a CUDA graph is being captured.

    Run each shape once eagerly (or precompile it: precompile_fp8_gemm_nt, precompile_model) before capturing; for
    k_grouped_fp8_gemm_tn_contiguous a new `ks` also needs one eager call (its offsets are uploaded then).

    Raised by:
        Every GEMM and quantizer on the kernel path, called under torch.cuda.graph capture with a kernel not yet
            loaded in this process.

    Example::

        deepgemm.fp8_gemm_nt(a, b, out)          # eager: compiles and loads the kernel
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            deepgemm.fp8_gemm_nt(a, b, out)      # captured; a new shape here would raise GraphCaptureError
    """


class GroupedLayoutError(ValueError):
    """A grouping tensor's values (m_indices, psum, masked_m) break their layout's rules. A ValueError: ``argument``
    names the tensor, ``index`` the first offending entry (a row of m_indices, an expert of psum or masked_m); the
    message states the rule and what the kernel would compute with the value.

    Raised by:
        deepgemm.check_grouped_layout, and the grouped GEMMs (m_grouped_fp8_gemm_nt_contiguous, _psum, _masked and
            their BF16 forms m_grouped_bf16_gemm_nt_*) called with validate=True; both read the grouping tensor on
            the host.

    Example::

        try:
            deepgemm.check_grouped_layout(num_groups=8, m_indices=m_indices)
        except deepgemm.GroupedLayoutError as error:
            print(error.argument, error.index, error)
    """

    def __init__(self, message: str, argument: str, index: int | None = None) -> None:
        super().__init__(message)
        self.argument = argument
        self.index = index

    def __reduce__(self) -> tuple[type[GroupedLayoutError], tuple[str, str, int | None]]:
        return type(self), (str(self), self.argument, self.index)


class NotDifferentiableError(UnsupportedError):
    """An op without a backward was called on inputs that require grad, with grad mode on.

    A subclass of UnsupportedError. Call under torch.inference_mode() or torch.no_grad(), or detach the inputs.

    Raised by:
        Every GEMM and quantizer, on every path, when an argument (or `out`) requires grad while
            torch.is_grad_enabled().

    Example::

        x = torch.randn(16, 512, device="cuda", requires_grad=True)
        try:
            deepgemm.quantize_per_token_group(x)
        except deepgemm.NotDifferentiableError:
            q, sf = deepgemm.quantize_per_token_group(x.detach())
    """


class CacheError(DeepGemmError, OSError):
    """A filesystem operation on the kernel cache failed: a read-only or full cache dir, a file where one of its
    folders should be, a cubin that vanished.

    Both an ``OSError`` (``errno``, ``strerror`` and ``filename`` are those of the failure; ``except OSError``
    catches it) and a ``DeepGemmError`` (``except DeepGemmError`` catches every error of deepgemm's own). Never a
    ``CompileError``: the compiler did not fail. The message names the path, the cause and the way out::

        deepgemm kernel cache: cannot write /c/tmp/<key>-x/meta.json: No space left on device (ENOSPC);
        set DEEPGEMM_CACHE_DIR to move the cache

    Raised by:
        Whatever compiles or loads a kernel (the first GPU call of a shape, the precompile functions and
            commands) when the cache directory (DEEPGEMM_CACHE_DIR, default ~/.cache/deepgemm) cannot be used.

    Example::

        try:
            deepgemm.precompile_fp8_gemm_nt(4096, 2112, 7168)
        except deepgemm.CacheError as exc:
            print(exc.filename, exc.strerror)
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
    than the compile timeout allows; the message names the kernel and its key.

    Both a DeepGemmError and a TimeoutError. Waiting for another process (the disk cache's lock) lasts
    DEEPGEMM_COMPILE_TIMEOUT plus a margin; waiting for another thread of this process, which may itself wait for
    that lock and then compile, twice DEEPGEMM_COMPILE_TIMEOUT plus the margin.

    Raised by:
        Whatever compiles or loads a kernel, when another thread or process holds that kernel's lock too long.

    Example::

        try:
            deepgemm.precompile_fp8_gemm_nt(4096, 2112, 7168)
        except deepgemm.LockTimeoutError as exc:
            print("another process is still compiling:", exc)
    """
