"""Writes one benchmark's results into its own section of docs/BENCHMARKS.md.

Each benchmark owns the text between `<!-- NAME:start -->` and `<!-- NAME:end -->`; running it again
replaces that section and leaves the others as they are.
"""

import re
import shlex
import sys
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"
PREAMBLE = "# Benchmarks\n\nEach section was written by the command it names, on a 2-core CPU machine.\n"


def command_line() -> str:
    return "python " + " ".join(shlex.quote(arg) for arg in sys.argv)


def write_section(name: str, title: str, body: str) -> None:
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else PREAMBLE
    section = f"<!-- {name}:start -->\n## {title}\n\nCommand: `{command_line()}`\n\n{body.strip()}\n<!-- {name}:end -->"
    pattern = re.compile(rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->", re.S)
    text = (
        pattern.sub(lambda _: section, text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + section + "\n"
    )
    BENCHMARKS_MD.parent.mkdir(parents=True, exist_ok=True)
    BENCHMARKS_MD.write_text(text)


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
