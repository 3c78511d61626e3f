"""Printing helpers shared by the commands: tables from ``summary_rows`` and JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()


def rows_table(title: str, rows: Iterable[tuple[str, str]]) -> Table:
    """A two-column table from ``(label, value)`` rows."""
    table = Table(title=title, show_header=False, title_justify="left", title_style="bold")
    table.add_column("field", style="cyan", no_wrap=True)
    table.add_column("value")
    for label, value in rows:
        table.add_row(label, value)
    return table


def print_json(data: Any) -> None:
    """Print machine-readable JSON to stdout (no colour, no wrapping)."""
    click_echo = __import__("click").echo
    click_echo(json.dumps(data, indent=2))
