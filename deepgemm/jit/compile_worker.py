"""Out-of-process NVRTC compile: ``python path/to/compile_worker.py``.

(``python -m deepgemm.jit.compile_worker`` works too, but imports the deepgemm
package first; the compiler runs the file directly to keep startup fast.)

Reads one JSON request on stdin::

    {"source": str, "name": str, "options": [str], "cubin_path": str,
     "cuda_include_dir": str | null}

writes the cubin to ``cubin_path`` and one JSON reply line on stdout::

    {"ok": bool, "status": str, "log": str, "options": [str]}

Exit status 0 on success, EXIT_COMPILE_ERROR when NVRTC rejects the program,
EXIT_WRITE_ERROR when the cubin cannot be written (status "WRITE_FAILED"; the
reply adds "errno", "strerror" and "path", e.g. ENOSPC in the cache).
The worker dies with the thread that started it (Linux PR_SET_PDEATHSIG), and
exits with EXIT_ORPHANED, compiling nothing, when its caller (the pid in
DEEPGEMM_WORKER_PARENT) died before that was set.
Imports only the standard library and cuda.bindings so that it starts fast;
running in its own process means a compiler crash cannot kill the caller.
``cuda_include_dir`` is where NVRTC's bundled CUDA headers (cuda_bf16.h,
cuda_fp8.h, CCCL, ...) are unpacked once and added to the include path.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# Run as a script, this file's directory heads sys.path; drop it so that its
# sibling modules (cache.py, compiler.py, ...) cannot shadow anything.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

EXIT_COMPILE_ERROR = 3
EXIT_WRITE_ERROR = 4
EXIT_ORPHANED = 5
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class _WriteFailure(Exception):
    """The cubin could not be written: (errno, strerror, path, log)."""


class _NvrtcFailure(Exception):
    """An NVRTC call returned an error status."""


def main() -> int:
    _die_with_parent()
    request = json.loads(sys.stdin.read())
    from cuda.bindings import nvrtc

    header_note, options = "", list(request["options"])
    try:
        header_note, header_options = _cuda_header_options(nvrtc, request.get("cuda_include_dir"))
        options += header_options
        log = _compile(nvrtc, request, options)
        reply = {"ok": True, "status": "NVRTC_SUCCESS", "log": log}
    except _NvrtcFailure as failure:
        status, log = failure.args
        reply = {"ok": False, "status": status, "log": header_note + log}
    except _WriteFailure as failure:
        number, strerror, path, log = failure.args
        reply = {"ok": False, "status": "WRITE_FAILED", "log": log, "errno": number, "strerror": strerror,
                 "path": path}
    sys.stdout.write(json.dumps({**reply, "options": options}) + "\n")
    if reply["ok"]:
        return 0
    return EXIT_WRITE_ERROR if reply["status"] == "WRITE_FAILED" else EXIT_COMPILE_ERROR


def _die_with_parent() -> None:
    """Have Linux SIGKILL this worker when its caller dies (a caller killed mid-compile leaves no worker
    running on, writing into a staging dir that another process may be cleaning); a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):  # no libc or no prctl: nothing to do
        return
    parent = os.environ.get("DEEPGEMM_WORKER_PARENT", "")
    if parent.isdigit() and os.getppid() != int(parent):  # the caller died before prctl took effect
        os._exit(EXIT_ORPHANED)


def _compile(nvrtc: Any, request: dict[str, Any], options: list[str]) -> str:
    """Compile ``request['source']``; write the cubin; return the program log."""
    prog = _check(
        nvrtc,
        nvrtc.nvrtcCreateProgram(
            request["source"].encode(), request["name"].encode(), 0, [], []
        ),
    )
    try:
        encoded = [opt.encode() for opt in options]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        log = _program_log(nvrtc, prog)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise _NvrtcFailure(status.name, log)
        size = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog))
        cubin = bytearray(size)
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin))
        try:
            Path(request["cubin_path"]).write_bytes(bytes(cubin))
        except OSError as exc:
            raise _WriteFailure(exc.errno, exc.strerror, request["cubin_path"], log) from exc
        return log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _program_log(nvrtc: Any, prog: Any) -> str:
    size = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog))
    buffer = bytearray(size)
    _check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buffer))
    return bytes(buffer).rstrip(b"\0").decode(errors="replace")


def _check(nvrtc: Any, result: tuple[Any, ...]) -> Any:
    """Unpack a cuda.bindings result tuple; raise on a non-success status."""
    status, *values = result
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise _NvrtcFailure(status.name, "")
    return values[0] if values else None


def _cuda_header_options(nvrtc: Any, install_dir: str | None) -> tuple[str, list[str]]:
    """Include flags for CUDA's own headers, and a note for the log on failure.

    NVRTC's bundled headers (same version as the compiler), unpacked into ``install_dir``; an NVRTC without a
    bundle falls back to a CUDA toolkit's include directory. A bundle that cannot be unpacked is a failure.
    """
    note = ""
    if install_dir is None:
        return note, []
    if install_dir is not None:
        try:
            status, *_ = nvrtc.nvrtcInstallBundledHeaders(install_dir.encode(), 0)
        except Exception:  # older NVRTC (e.g. 13.0): the entry point is missing
            note = "note: this NVRTC has no bundled headers\n"
        else:
            if status == nvrtc.nvrtcResult.NVRTC_SUCCESS:
                return "", [f"-I{install_dir}", f"-I{install_dir}/cccl"]
            # Never another set of headers in their place: the cubin would be cached under the same key.
            raise _NvrtcFailure("HEADERS_FAILED", f"could not unpack NVRTC's bundled CUDA headers into {install_dir} "
                                f"({status.name}); fix or remove that path (DEEPGEMM_NVRTC_HEADERS_DIR names another)")
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        include = Path(root or "", "include")
        if root and (include / "cuda_bf16.h").is_file():
            dirs = [include, include / "cccl"]
            return note, [f"-I{d}" for d in dirs if d.is_dir()]
    return note, []


if __name__ == "__main__":
    sys.exit(main())
