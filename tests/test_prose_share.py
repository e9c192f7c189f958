"""The library's prose stays lean: under 15 % of its lines, no module docstring over 15 lines.

Prose is every line of a docstring (a string statement opening a module, class or function) and
every line holding a comment (``tokenize``'s COMMENT, an inline one too), counted once; the share
is of all lines of the ``.py`` files under rocm_vit/ and backends/, blank lines included.
``python tests/test_prose_share.py`` prints the share and the files with the most prose.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("rocm_vit", "backends")
MAX_PROSE_SHARE = 0.15
MAX_MODULE_DOCSTRING_LINES = 15


def prose_lines(source: str) -> set[int]:
    """Line numbers of ``source`` that are docstring or comment."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        documented = isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        if documented and ast.get_docstring(node, clean=False) is not None:
            lines.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    lines.update(token.start[0] for token in tokens if token.type == tokenize.COMMENT)
    return lines


def module_docstring_lines(source: str) -> int:
    """The source lines the module docstring spans, its quotes' lines included."""
    module = ast.parse(source)
    if ast.get_docstring(module, clean=False) is None:
        return 0
    return module.body[0].end_lineno - module.body[0].lineno + 1


def library_sources() -> dict[str, str]:
    files = sorted(path for folder in LIBRARY for path in (ROOT / folder).rglob("*.py"))
    return {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in files}


def test_prose_is_under_15_percent_of_the_librarys_lines() -> None:
    sources = library_sources()
    prose = {name: len(prose_lines(source)) for name, source in sources.items()}
    total = sum(len(source.splitlines()) for source in sources.values())
    share = sum(prose.values()) / total
    most = sorted(prose.items(), key=lambda item: -item[1])[:5]
    assert share < MAX_PROSE_SHARE, f"prose is {share:.1%} of {total} lines; most in {most}"


def test_no_module_docstring_runs_past_15_lines() -> None:
    long = {
        name: lines
        for name, source in library_sources().items()
        if (lines := module_docstring_lines(source)) > MAX_MODULE_DOCSTRING_LINES
    }
    assert not long, f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines: {long}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('"""One line."""\n\nx = 1\n', {1}),
        ('"""Two\nlines."""\n# why\nx = 1  # inline\ny = "not prose"\n', {1, 2, 3, 4}),
        ('def f():\n    """Doc."""\n    s = """a\nb"""\n    return s\n', {2}),
        ("class C:\n    '''Doc\n    more.'''\n\n    x = '#'\n", {2, 3}),
    ],
)
def test_prose_lines_are_docstrings_and_comments_only(source: str, expected: set[int]) -> None:
    assert prose_lines(source) == expected


if __name__ == "__main__":
    sources = library_sources()
    counts = {name: (len(prose_lines(source)), len(source.splitlines())) for name, source in sources.items()}
    prose, total = sum(p for p, _ in counts.values()), sum(n for _, n in counts.values())
    print(f"prose {prose} of {total} lines: {prose / total:.1%}")
    for name, (p, n) in sorted(counts.items(), key=lambda item: -item[1][0])[:20]:
        print(f"{p:5d} {n:5d} {p / n:6.1%}  {name}")
