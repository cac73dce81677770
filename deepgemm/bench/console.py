"""Terminal output for the commands: tables and a progress bar through rich, plain text without it."""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_PIPE_WIDTH = 200  # text lines off a terminal: rich would wrap them at 80 columns
TABLE_WIDTH = 100  # the columns a table is laid out for off a terminal (on a terminal: the terminal's width)


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
                left_columns: int | Collection[int] = 1, caption: str | None = None, key_columns: int = 1,
                fold: Collection[int] = (), drop: Sequence[int] = ()) -> None:
    """A table of text cells: numbers right-aligned, the ``left_columns`` (the first n, or these indices) left.

    A table wider than the output (a terminal's width, else TABLE_WIDTH) is made to fit, in three steps: the
    ``fold`` columns (free text, such as a config) leave it for one wrapped line per row below it; the ``drop``
    columns are left out in that order while it is still too wide (the caption names them); what is still too wide
    is split into tables that each repeat the first ``key_columns`` (a shape or a name, which is never cut).
    """
    cells: list[list[str]] = [[str(cell) for cell in row] for row in rows]
    left = set(range(left_columns)) if isinstance(left_columns, int) else set(left_columns)
    console = _rich_console()
    budget = table_budget(console)
    plain = console is None
    widths = [max(_cell_width(cell) for cell in column) for column in zip(headers, *cells)]

    def fits(columns: Sequence[int]) -> bool:
        return _table_width([widths[c] for c in columns], plain) <= budget

    columns = list(range(len(headers)))
    folded = [c for c in columns if c in fold] if not fits(columns) else []
    columns = [c for c in columns if c not in folded]
    dropped = []
    for c in drop:
        if fits(columns):
            break
        if c in columns:
            columns.remove(c)
            dropped.append(headers[c])
    if dropped:
        note = f"left out to fit {budget} columns: {', '.join(dropped)}"
        caption = f"{caption}; {note}" if caption else note
    keys = [c for c in columns if c < key_columns]
    groups = _split_columns(keys, [c for c in columns if c >= key_columns], fits)
    for index, group in enumerate(groups):
        part = title if index == 0 else f"{title} (continued)"
        _render_table(console, budget, part, [headers[c] for c in group], [[row[c] for c in group] for row in cells],
                      {i for i, c in enumerate(group) if c in left}, {i for i, c in enumerate(group) if c in keys},
                      caption if index == len(groups) - 1 else None)
    for c in folded:
        _print_folded(console, budget, headers[c], [(" ".join(row[k] for k in keys), row[c]) for row in cells])


def table_budget(console: Any | None) -> int:
    """The width a table must fit: the terminal's, or TABLE_WIDTH off a terminal."""
    if console is not None:
        return int(console.width) if console.is_terminal else TABLE_WIDTH
    return shutil.get_terminal_size((TABLE_WIDTH, 24)).columns if sys.stdout.isatty() else TABLE_WIDTH


def _cell_width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def _table_width(widths: Sequence[int], plain: bool) -> int:
    """Columns a table of these column widths takes: plain text joins cells with two spaces; rich pads each cell
    with a space on both sides and draws a border between and around the columns."""
    if plain:
        return sum(widths) + 2 * max(len(widths) - 1, 0)
    return sum(width + 3 for width in widths) + 1


def _split_columns(keys: list[int], others: list[int], fits: Callable[[Sequence[int]], bool]) -> list[list[int]]:
    """The key columns followed by as many of the others, in order, as fit; again for the rest (a column that fits
    in no group goes alone with the keys)."""
    groups: list[list[int]] = []
    current: list[int] = []
    for c in others:
        if current and not fits(keys + current + [c]):
            groups.append(keys + current)
            current = []
        current.append(c)
    groups.append(keys + current)
    return groups


def _render_table(console: Any | None, budget: int, title: str, headers: Sequence[str], rows: list[list[str]],
                  left: set[int], keys: set[int], caption: str | None) -> None:
    if console is None:
        _print_plain_table(title, headers, rows, left, caption)
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), caption=escape(caption) if caption else None, title_justify="left",
                  caption_justify="left")
    for index, header in enumerate(headers):
        # A key column may wrap and folds what is too long rather than cutting it.
        table.add_column(escape(header), justify="left" if index in left else "right",
                         no_wrap=index not in left and index not in keys, overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    _emit(console, table, width=budget)


def _print_folded(console: Any | None, budget: int, header: str, items: list[tuple[str, str]]) -> None:
    """A folded column: its header, then one wrapped line per row that has a value (nothing when none has)."""
    if not any(value for _, value in items):
        return
    lines = [f"{header}:"]
    for key, value in items:
        if value:
            lines += textwrap.wrap(value, width=budget, initial_indent=f"  {key}: " if key else "  ",
                                   subsequent_indent="      ", break_long_words=False, break_on_hyphens=False)
    for line in lines:
        if console is None:
            print(line)
        else:
            from rich.markup import escape

            _emit(console, escape(line), width=budget)


def track(items: Sequence[T], description: str, label: Callable[[T], str] = str, *,
          outcome: Callable[[T], str] | None = None) -> Iterator[T]:
    """Iterate with a progress bar on a terminal (rich), or one stderr line per item elsewhere.

    With ``outcome``, each item's line comes once its work is done and ends with ``outcome(item)`` (such as
    "cached" or "compiled in 0.6 s"); on a terminal those lines print above the bar.
    """
    console = _rich_console()
    if console is None or not console.is_terminal:
        for index, item in enumerate(items, 1):
            line = f"[{index}/{len(items)}] {description} {label(item)}"
            if outcome is None:
                print(line, file=sys.stderr, flush=True)
            yield item
            if outcome is not None:
                print(f"{line}: {outcome(item)}", file=sys.stderr, flush=True)
        return
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[item]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=len(items), item="")
        for item in items:
            progress.update(task, item=label(item))
            yield item
            if outcome is not None:
                progress.console.print(escape(f"{label(item)}: {outcome(item)}"))
            progress.advance(task)


def _emit(console: Any, renderable: Any, width: int | None = None) -> None:
    """Print through rich (within ``width`` columns if given); off a terminal, without the padding rich adds to reach
    the console width."""
    if console.is_terminal:
        console.print(renderable, width=width)
        return
    with console.capture() as captured:
        console.print(renderable, width=width)
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
