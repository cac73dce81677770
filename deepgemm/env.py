"""Reading the package's environment variables (standard library only: the JIT layer imports it without torch)."""

from __future__ import annotations

import os

_FLAG_OFF = ("", "0", "false", "no", "off")
_FLAG_ON = ("1", "true", "yes", "on")


def env_flag(name: str) -> bool:
    """An on/off environment variable: unset, empty, 0, false, no, off (any case) are off; 1, true, yes, on are on;
    anything else raises ValueError naming the variable."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in _FLAG_OFF:
        return False
    if value in _FLAG_ON:
        return True
    raise ValueError(f"{name}={raw!r}: expected 1/true/yes/on or 0/false/no/off")
