"""Process-wide launch settings: programmatic dependent launch (set_pdl / get_pdl)."""

from __future__ import annotations

from deepgemm.jit.runtime import get_pdl, set_pdl

__all__ = ["get_pdl", "set_pdl"]
