"""The per-shape memo of tuning-file lookups both GEMM families use: each shape asks the tuning file once per
process; with DEEPGEMM_AUTOTUNE=1 an untuned shape is measured first and recorded."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from deepgemm.env import env_flag

Config = TypeVar("Config")


class TunedLookups(Generic[Config]):
    CAPACITY = 4096  # a full memo is dropped (a lookup is cheap to redo)

    def __init__(self) -> None:
        self._table: dict[Hashable, Config | None] = {}

    def get(self, key: Hashable, lookup: Callable[[], Config | None], tune: Callable[[], object]) -> Config | None:
        """The memoized lookup() for `key`; an untuned entry under DEEPGEMM_AUTOTUNE=1 runs tune() and looks again."""
        if key in self._table:
            return self._table[key]
        config = lookup()
        if config is None and env_flag("DEEPGEMM_AUTOTUNE"):
            tune()
            config = lookup()
        if len(self._table) >= self.CAPACITY:
            self._table.clear()
        self._table[key] = config
        return config
