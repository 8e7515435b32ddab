"""The one error type for bad input: it always says where (file, line) and why."""

from __future__ import annotations


class InputError(Exception):
    """A malformed or hostile input file. The CLI maps it to exit code 2 and prints `file:line: reason`."""

    def __init__(self, source: str, reason: str, line: int | None = None):
        self.source = source
        self.line = line
        self.reason = reason
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {reason}")
