"""Exception types raised by deepgemm."""

from __future__ import annotations


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
