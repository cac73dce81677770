"""Where a benchmark run writes its results: JSON and Markdown, by default in a fresh folder of its own.

A run of ``deepgemm bench`` writes ``results.json`` and ``results.md`` into ``./deepgemm-results/<time>-<name>/``
(``--results-dir DIR`` names the folder instead); ``--json PATH`` / ``--markdown PATH`` put that file elsewhere.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RESULTS_ROOT = Path("deepgemm-results")
JSON_NAME = "results.json"
MARKDOWN_NAME = "results.md"


@dataclass(frozen=True)
class ResultPaths:
    """The two files a run writes."""

    json: Path
    markdown: Path

    def describe(self) -> str:
        """The run's last line: where the two files are."""
        if self.json.parent == self.markdown.parent:
            return f"results in {self.json.parent}/: {self.json.name}, {self.markdown.name}"
        return f"results: {self.json}, {self.markdown}"

    def prepare(self) -> None:
        """Create the folders the files go into (OSError if that fails)."""
        for path in (self.json, self.markdown):
            path.parent.mkdir(parents=True, exist_ok=True)


def result_paths(name: str, *, json: Path | None = None, markdown: Path | None = None,
                 results_dir: Path | None = None, root: Path | None = None) -> ResultPaths:
    """--json and --markdown where given; the others in ``results_dir``, or else in a new folder
    ``<root>/<local time>-<name>`` (root: DEFAULT_RESULTS_ROOT), created only when a file goes there."""
    if json is not None and markdown is not None:
        return ResultPaths(json, markdown)
    folder = results_dir if results_dir is not None else _new_folder(root or DEFAULT_RESULTS_ROOT, name)
    return ResultPaths(json or folder / JSON_NAME, markdown or folder / MARKDOWN_NAME)


def _new_folder(root: Path, name: str) -> Path:
    """``root/<YYYYmmdd-HHMMSS>-<name>``, with ``-2``, ``-3``... when a run of the same second took that name."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{slug}"
    folder, count = root / base, 1
    while folder.exists():
        count += 1
        folder = root / f"{base}-{count}"
    return folder
