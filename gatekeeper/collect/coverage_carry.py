"""Coverage measured on one version of a file, carried to another version whose code is the same.

A GPU report is made at one commit; a later commit that only rewords comments or docstrings of a kernel file
leaves every statement that ran as it was, yet moves line numbers. Rather than drop such a file's coverage (and
ask for another GPU run), it is carried over when, and only when, the file's code provably did not change:

- the two sources parse to the same syntax tree once docstrings are set aside (comments and layout are not in
  the tree; every other string, name, operator and statement order is);
- every line the measurement names (statements, exclusions, executed lines) lies in a stretch of lines the two
  versions share word for word, so it can be followed to its new number;
- the statements and exclusions coverage.py finds in the new source are exactly those lines, followed.

Anything else (a reflowed statement, a moved function, a new `# pragma: no cover`) returns None: the caller
drops the coverage, as for a changed file.
"""

from __future__ import annotations

import ast
import difflib

from gatekeeper.collect.coverage_map import statement_spans
from gatekeeper.evidence import FileCoverage

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def carry_coverage(measured: FileCoverage, old_source: str, new_source: str,
                   new_statements: tuple[int, ...], new_excluded: tuple[int, ...]) -> FileCoverage | None:
    """`measured` (taken on `old_source`) on the lines of `new_source`, whose statements and exclusions by
    coverage.py are `new_statements` and `new_excluded`; None unless the two sources hold the same code."""
    code = _code(old_source)
    if code is None or code != _code(new_source):
        return None
    moved = _shared_lines(old_source, new_source)
    lines = {*measured.statements, *measured.excluded, *measured.covered}
    if not lines <= moved.keys():
        return None
    statements = tuple(sorted(moved[line] for line in measured.statements))
    excluded = tuple(sorted(moved[line] for line in measured.excluded))
    if statements != tuple(sorted(new_statements)) or excluded != tuple(sorted(new_excluded)):
        return None
    return measured.model_copy(update={
        "statements": statements,
        "excluded": excluded,
        "spans": statement_spans(new_source),
        "covered": {moved[line]: contexts for line, contexts in sorted(measured.covered.items())},
    })


def _code(source: str) -> str | None:
    """The source's syntax tree without docstrings, as text; None when it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, _DOCUMENTED) and node.body and _is_docstring(node.body[0]):
            node.body = node.body[1:]
    return ast.dump(tree, include_attributes=False)


def _is_docstring(statement: ast.stmt) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def _shared_lines(old_source: str, new_source: str) -> dict[int, int]:
    """Old line number -> new line number, for the lines in stretches both versions share unchanged."""
    old_lines, new_lines = old_source.splitlines(), new_source.splitlines()
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    return {a + 1 + i: b + 1 + i for a, b, size in matcher.get_matching_blocks() for i in range(size)}
