"""Human-readable numbers: SI prefixes for FLOPs and bytes, microseconds, percentages."""

from __future__ import annotations

_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """``si(1.5e12, "FLOP")`` -> ``'1.50 TFLOP'`` (3 significant digits)."""
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{_significant(value / scale, digits)} {prefix}{unit}"
    return f"{_significant(value, digits)} {unit}".rstrip()


def micros(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:,.0f}" if us >= 1000 else f"{us:.1f}" if us >= 10 else f"{us:.2f}"


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def _significant(value: float, digits: int) -> str:
    magnitude = abs(value)
    decimals = max(0, digits - (1 if magnitude < 10 else 2 if magnitude < 100 else 3))
    return f"{value:.{decimals}f}"
