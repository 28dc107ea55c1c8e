"""The console every command draws on: the terminal's width on a terminal, and on a pipe or a file a
width no table reaches, so that piped output is never cut at 80 columns ("roun…")."""

from __future__ import annotations

import sys
from typing import IO

from rich.console import Console

PIPE_WIDTH = 1000  # wider than any table we draw: rich sizes tables to their content, not to this


def make_console(file: IO[str] | None = None) -> Console:
    """A rich Console on `file` (stdout by default) sized for where it writes."""
    stream = file if file is not None else sys.stdout
    console = Console(file=stream)
    if not console.is_terminal:
        console = Console(file=stream, width=PIPE_WIDTH)
    return console
