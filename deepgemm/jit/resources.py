"""Parse the resource report that ``ptxas -v`` prints for each kernel."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_REGISTERS = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass(frozen=True)
class PtxasResources:
    """Per-kernel resource usage as reported by ptxas (sizes in bytes)."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared_static: int
    barriers: int

    def to_json(self) -> dict[str, int]:
        """Plain dict form, for meta.json."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PtxasResources:
        """Inverse of :meth:`to_json`; raises on missing or non-int fields."""
        values = {name: data[name] for name in cls.__dataclass_fields__}
        if not all(type(v) is int for v in values.values()):
            raise ValueError(f"non-integer field in {data!r}")
        return cls(**values)


def parse_ptxas_log(log: str, entry: str) -> PtxasResources | None:
    """Return the resources ptxas reported for ``entry``, or None if absent.

    Works on both NVRTC program logs and nvcc stderr. The frame/spill line
    belongs to the function named by the preceding "Function properties for"
    line; the "Used N registers" line belongs to the current entry function.
    """
    frame: tuple[int, int, int] | None = None
    used_line: str | None = None
    current_entry: str | None = None
    properties_of: str | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current_entry, properties_of = m.group(1), None
        elif m := _PROPERTIES.search(line):
            properties_of = m.group(1)
        elif m := _FRAME.search(line):
            if properties_of == entry:
                frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            properties_of = None
        elif _REGISTERS.search(line) and current_entry == entry:
            used_line = line
    if used_line is None:
        return None
    stack, stores, loads = frame or (0, 0, 0)
    return PtxasResources(
        registers=_int_or_zero(_REGISTERS, used_line),
        spill_stores=stores,
        spill_loads=loads,
        stack_frame=stack,
        shared_static=_int_or_zero(_SMEM, used_line),
        barriers=_int_or_zero(_BARRIERS, used_line),
    )


def _int_or_zero(pattern: re.Pattern[str], line: str) -> int:
    m = pattern.search(line)
    return int(m.group(1)) if m else 0
