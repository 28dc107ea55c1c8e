"""The package's size limits: every module under 400 lines and no function over 60, so that a newcomer can
read any file top to bottom and any function on one screen (the project's DESIGN/STYLE limits)."""

import ast
from collections.abc import Iterator
from pathlib import Path

import slowlink as sl

PACKAGE = Path(sl.__file__).parent
MODULE_LINES = 400  # a module stays under this many lines
FUNCTION_LINES = 60  # a function or method is at most this many lines, its def line included


def functions(tree: ast.AST, outer: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method in `tree`, nested ones too, with its dotted name ("S3Mailbox.__init__")."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = outer + node.name
            if not isinstance(node, ast.ClassDef):
                yield name, node
            yield from functions(node, f"{name}.")
        else:
            yield from functions(node, outer)


def test_every_module_is_under_400_lines_and_no_function_is_over_60():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        where = path.relative_to(PACKAGE)
        lines = len(source.splitlines())
        if lines >= MODULE_LINES:
            violations.append(f"{where}: module is {lines} lines (must be under {MODULE_LINES})")
        for name, node in functions(ast.parse(source)):
            length = node.end_lineno - node.lineno + 1
            if length > FUNCTION_LINES:
                violations.append(
                    f"{where}:{node.lineno}: {name} is {length} lines (at most {FUNCTION_LINES})"
                )
    assert not violations, f"{len(violations)} over the size limits:\n" + "\n".join(violations)
