"""Terminal output for the commands: tables and a progress bar through rich, plain text without it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_PIPE_WIDTH = 200  # rich would squeeze tables to 80 columns when output is piped


def _rich_console() -> Any | None:
    try:
        from rich.console import Console
    except ImportError:
        return None
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=_PIPE_WIDTH)
    return console


def say(text: str = "") -> None:
    """Print a line (rich markup such as ``[bold]`` is allowed and stripped without rich)."""
    console = _rich_console()
    if console is None:
        print(_strip_markup(text))
    else:
        _emit(console, text)


def print_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[str]], *,
                left_columns: int | Collection[int] = 1, caption: str | None = None) -> None:
    """A table of text cells: numbers right-aligned, the ``left_columns`` (the first n, or these indices) left."""
    cells: list[list[str]] = [list(row) for row in rows]
    left = set(range(left_columns)) if isinstance(left_columns, int) else set(left_columns)
    console = _rich_console()
    if console is None:
        _print_plain_table(title, headers, cells, left, caption)
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), caption=escape(caption) if caption else None, title_justify="left",
                  caption_justify="left")
    for index, header in enumerate(headers):
        table.add_column(escape(header), justify="left" if index in left else "right", no_wrap=index not in left)
    for row in cells:
        table.add_row(*(escape(str(cell)) for cell in row))
    _emit(console, table)


def track(items: Sequence[T], description: str, label: Callable[[T], str] = str) -> Iterator[T]:
    """Iterate with a progress bar on a terminal (rich), or one stderr line per item elsewhere."""
    console = _rich_console()
    if console is None or not console.is_terminal:
        for index, item in enumerate(items, 1):
            print(f"[{index}/{len(items)}] {description} {label(item)}", file=sys.stderr, flush=True)
            yield item
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[item]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=len(items), item="")
        for item in items:
            progress.update(task, item=label(item))
            yield item
            progress.advance(task)


def _emit(console: Any, renderable: Any) -> None:
    """Print through rich; off a terminal, without the padding rich adds to reach the console width."""
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def _print_plain_table(title: str, headers: Sequence[str], rows: list[list[str]], left: set[int],
                       caption: str | None) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    print(title)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    if caption:
        print(caption)


def _strip_markup(text: str) -> str:
    import re

    return re.sub(r"\[/?[a-z ]+\]", "", text)


def usage_error(command: str, message: str) -> int:
    """Report bad input the way argparse does, and return its exit code (2)."""
    print(f"deepgemm {command}: error: {message}", file=sys.stderr)
    return 2
