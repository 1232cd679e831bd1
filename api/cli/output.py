"""What the CLI prints: one style for every list and create, and one progress display.

- A table for people, `--json` for scripts. On a terminal a table is drawn (rich); into a pipe
  the same rows are tab-separated lines without a header, so `cut -f1` works (as gh does).
  `--json` prints the server's data as JSON, whatever stdout is.
- Progress (stage, bar, done/total, time) is drawn on stderr while long work runs and cleared
  when it ends; it is never printed when stderr is not a terminal, nor under `--json`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from reports.money import NO_CURRENCY, amount_text


def emit(data: Any) -> None:
    """`--json`: the data as indented JSON on stdout."""
    print(json.dumps(data, indent=2, sort_keys=True))


def json_wanted() -> bool:
    """Whether the running command (or a group above it) was given `--json`."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.params.get("as_json"):
            return True
        ctx = ctx.parent
    return False


def progress_wanted() -> bool:
    """Progress is for people: drawn on a terminal's stderr, never under `--json`."""
    return sys.stderr.isatty() and not json_wanted()


# -- tables ----------------------------------------------------------------------------------------
@dataclass
class Listing:
    """Rows under named columns: a table on a terminal, tab-separated lines in a pipe. Rich
    renders it as its table (`__rich__`)."""

    columns: tuple[str, ...]
    rows: list[tuple[str, ...]] = field(default_factory=list)
    title: str | None = None
    no_wrap: tuple[str, ...] = ()

    def add(self, *cells: object) -> None:
        self.rows.append(tuple("" if c is None else str(c) for c in cells))

    def __rich__(self) -> Table:
        table = Table(title=self.title)
        for column in self.columns:
            table.add_column(column, no_wrap=column in self.no_wrap)
        for row in self.rows:
            table.add_row(*row)
        return table

    def lines(self) -> list[str]:
        """The rows as tab-separated lines (a tab or line break inside a cell becomes a space)."""
        return ["\t".join(" ".join(cell.split("\t")).replace("\n", " ") for cell in row) for row in self.rows]


def show(*listings: Listing) -> None:
    """Print tables for people: drawn on a terminal, tab-separated rows into a pipe."""
    if sys.stdout.isatty():
        console = Console()
        for listing in listings:
            console.print(listing)
        return
    for listing in listings:
        for line in listing.lines():
            print(line)


# -- money -----------------------------------------------------------------------------------------
def money(minor: int | None, currency: str | None) -> str:
    """Minor units as money in the currency's decimals: `780, "usd"` -> `7.80 usd`,
    `1250, "kwd"` -> `1.250 kwd`, `500, "jpy"` -> `500 jpy`; no amount -> `-`."""
    if minor is None:
        return "-"
    code = currency or NO_CURRENCY
    return f"{amount_text(minor, code)} {code}"


def delta(minor: int, currency: str | None) -> str:
    """A signed change as money: `+7.80 usd`, `-1.250 kwd`, `+0.00 usd`."""
    return ("-" if minor < 0 else "+") + money(abs(minor), currency)


# -- progress --------------------------------------------------------------------------------------
class Progress:
    """The CLI's progress display for long work, as a context manager: `update(stage, done,
    total)` as the work goes; a label alone (never updated) shows that something is under way.
    Drawn only where `progress_wanted()`, and cleared at the end, so a failure's one line and
    a success's summary are all that stays."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Progress:
        if progress_wanted():
            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=None)
        return self

    def update(self, stage: str, done: int, total: int) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=stage, completed=done, total=max(1, total))

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
