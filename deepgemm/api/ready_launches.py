"""Launch-ready work for argument sets that passed validation before: metadata key -> (plan, packed kernel arguments).

The public GEMM functions key each argument tensor's pointer, shape, stride and dtype (under unified addressing a
pointer also pins the tensor's device) and launch a remembered entry with one dictionary lookup. Only calls that
needed no layout copy are remembered, so the cached pointers are the caller's own.
"""

from __future__ import annotations

from typing import Any

CAPACITY = 4096  # entries per table; a full table is dropped (entries are cheap to rebuild)


def keep(table: dict[tuple, Any], key: tuple, value: Any) -> None:
    """Store `value` under `key`; a full table is dropped first."""
    if len(table) >= CAPACITY:
        table.clear()
    table[key] = value


def remember(table: dict[tuple, Any], key: tuple, plan: Any, args: Any) -> None:
    keep(table, key, (plan, args))
