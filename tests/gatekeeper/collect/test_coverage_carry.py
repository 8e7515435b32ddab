"""Coverage carried from one version of a file to another only when the code is the same."""

from __future__ import annotations

import textwrap

import pytest
from coverage.exceptions import CoverageException

from gatekeeper.collect.coverage_carry import carry_coverage
from gatekeeper.collect.coverage_map import file_statements, statement_spans
from gatekeeper.evidence import FileCoverage

OLD = textwrap.dedent('''\
    """A kernel module."""


    def scale(x, factor):
        """Scales x."""
        # by factor
        y = [v * factor
             for v in x]
        return y


    def unused(x):
        return x  # pragma: no cover
''')


def measured_on(tmp_path, source: str) -> FileCoverage:
    """What a run that called scale() would record on `source`: its statements, with scale's body executed."""
    statements, excluded = analysed(tmp_path, source)
    body = [n for n, line in enumerate(source.splitlines(), 1) if line.lstrip().startswith(("y = ", "return y"))]
    return FileCoverage(path="tiny/kernels.py", statements=statements, excluded=excluded,
                        spans=statement_spans(source), covered={line: (0,) for line in body})


def analysed(tmp_path, source: str):
    path = tmp_path / "kernels.py"
    path.write_text(source)
    return file_statements(path)


def carry(tmp_path, new: str) -> FileCoverage | None:
    return carry_coverage(measured_on(tmp_path, OLD), OLD, new, *analysed(tmp_path, new))


def test_comment_and_docstring_edits_carry_the_coverage_to_the_new_lines(tmp_path):
    new = OLD.replace('"""Scales x."""', '"""Scales x,\n    element by element."""').replace(
        "# by factor", "# by factor\n        # (a second comment line)")
    carried = carry(tmp_path, new)
    assert carried is not None
    # The same statements two lines further down, and the same lines executed, as the new file's own analysis.
    assert carried == measured_on(tmp_path, new)
    assert sorted(carried.covered) == [n + 2 for n in sorted(measured_on(tmp_path, OLD).covered)]


def test_an_unchanged_file_carries_as_it_is(tmp_path):
    assert carry(tmp_path, OLD) == measured_on(tmp_path, OLD)


@pytest.mark.parametrize("new, why", [
    (OLD.replace("v * factor", "v * factor * 2"), "a changed expression"),
    (OLD.replace('"""A kernel module."""', '"""A kernel module."""\nLIMIT = 3'), "an added statement"),
    (OLD.replace("y = [v * factor\n         for v in x]", "y = [v * factor for v in x]"), "a reflowed statement"),
    (OLD.replace("return x  # pragma: no cover", "return x"), "an exclusion removed"),
    (OLD.replace("# by factor", "# by factor  # pragma: no cover"), "an exclusion added on a comment line"),
    (OLD.replace('"""Scales x."""', 'print("Scales x.")'), "a docstring turned into code"),
    (OLD.split("\n\n\ndef unused")[0] + "\n", "a function removed"),
    ("def scale(:\n", "a source that does not parse"),
])
def test_any_change_of_code_drops_the_coverage(tmp_path, new, why):
    assert new != OLD, why
    try:
        statements, excluded = analysed(tmp_path, new)
    except CoverageException:  # coverage.py refuses what does not parse: the caller then drops the coverage itself
        statements, excluded = (), ()
    assert carry_coverage(measured_on(tmp_path, OLD), OLD, new, statements, excluded) is None, why


def test_functions_swapped_drop_the_coverage(tmp_path):
    scale, unused = OLD.split("\n\n\n")[1:]
    assert carry(tmp_path, '"""A kernel module."""\n\n\n' + unused + "\n\n" + scale) is None
