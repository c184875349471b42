"""Functions short enough to read at once: none in the product over MAX_FUNCTION_LINES.

Counted by `ast` from a function's `def` to its last line (docstring, comments and blank
lines included), nested functions both in their own right and as part of the one around them.
A function that grows past it is split into named helpers, not exempted here."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("agent", "pipelines", "models", "workers", "knowledge", "transcription")
MAX_FUNCTION_LINES = 80


def long_functions(paths, limit: int = MAX_FUNCTION_LINES, root: Path = ROOT) -> list[str]:
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def product_files() -> list[Path]:
    return sorted(path for package in PRODUCT for path in (ROOT / package).rglob("*.py"))


def test_no_product_function_is_longer_than_the_limit():
    files = product_files()
    assert len(files) > 100  # the product was found, not an empty tree
    assert long_functions(files) == []


def test_a_long_function_is_found(tmp_path):
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def short():\n    pass\n\n\nasync def long():\n{body}\n")
    found = long_functions([tmp_path / "long.py"], MAX_FUNCTION_LINES, root=tmp_path)
    assert len(found) == 1 and " long (81 lines)" in found[0]
