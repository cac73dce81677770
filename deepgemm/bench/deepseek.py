"""DeepGEMM (deepseek-ai, imported as ``deep_gemm``) as a benchmark peer, when it is installed.

Its FP8 kernels take the same math as ours (1x128 activation scales, 128x128 weight scales, BF16 out)
but want their scales in their own layout. The scales are converted here once, before timing, with
DeepGEMM's own ``transform_sf_into_required_layout`` (so a timed call never includes a layout copy);
where that function is missing or refuses, the scales go in as they are and DeepGEMM converts them
itself on every call, which the measurement's note then says.
"""

from __future__ import annotations

from functools import cache
from typing import Any

RECIPE = (1, 128, 128)


class PeerMissing(Exception):
    """``deep_gemm`` cannot be imported here; ``str(exc)`` says why."""


@cache
def load() -> Any:
    """The ``deep_gemm`` module (its import builds or loads a compiled extension). A successful import is kept; a
    failed one raises PeerMissing and is tried again on the next call (functools.cache keeps no exceptions)."""
    try:
        import deep_gemm
    except Exception as exc:  # noqa: BLE001 - ImportError, or its extension failing to load (OSError, RuntimeError)
        raise PeerMissing(f"DeepGEMM (deep_gemm) is not importable: {type(exc).__name__}: {exc}") from None
    return deep_gemm


def missing() -> str | None:
    """Why DeepGEMM cannot run here (not importable), or None."""
    try:
        load()
    except PeerMissing as exc:
        return str(exc)
    return None


def version() -> str:
    """'deep_gemm X.Y' (the module's __version__, else an installed distribution's version)."""
    module = load()
    declared = getattr(module, "__version__", None)
    return f"deep_gemm {declared}" if declared else _package_version()


def _package_version() -> str:
    from importlib import metadata

    for name in ("deep_gemm", "deep-gemm", "sgl-deep-gemm"):
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return "deep_gemm (version unknown)"


def scales(sf: Any, mn: int, k: int, *, is_sfa: bool, groups: int | None = None) -> tuple[Any, str]:
    """(scales in DeepGEMM's layout, note): converted once by DeepGEMM itself where it can."""
    module = load()
    transform = getattr(module, "transform_sf_into_required_layout", None)
    if transform is None:
        return sf, "scales converted by DeepGEMM on every call (no transform_sf_into_required_layout)"
    try:
        return transform(sf, mn, k, RECIPE, num_groups=groups, is_sfa=is_sfa), ""
    except Exception as exc:  # noqa: BLE001 - a refusal leaves DeepGEMM's per-call conversion in place
        return sf, f"scales converted by DeepGEMM on every call ({type(exc).__name__}: {str(exc)[:80]})"


def m_alignment() -> int | None:
    """Row alignment DeepGEMM's contiguous grouped layout needs (128 on Hopper), or None if it does not say."""
    module = load()
    for name in ("get_mk_alignment_for_contiguous_layout", "get_m_alignment_for_contiguous_layout"):
        getter = getattr(module, name, None)
        if getter is not None:
            try:
                value = int(getter())
            except Exception:  # noqa: BLE001 - a peer's helper failing only leaves the peer out
                return None
            return value if value > 0 else None
    return None
