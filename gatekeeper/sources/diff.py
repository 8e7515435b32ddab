"""ChangeSet from a unified diff in git's format (`git diff`, `git format-patch`, GitHub's `.diff`).

unidiff parses the hunks. What unidiff leaves to its caller is done here, strictly:
  * the git extended header (new/deleted file mode, old/new mode, index, rename/copy from/to) gives the
    status, the paths and the modes; unidiff's own guesses from the `diff --git` line break on paths with
    spaces and cannot tell a copy from a rename;
  * git C-quotes unusual paths (`"a/t\\303\\251st"`); they are unquoted here, and must be valid UTF-8;
  * unidiff files any line it does not recognise as "patch info" and moves on; here every line outside a
    hunk must be a git header line, so a truncated or spliced diff is an error with its line number, never
    a file that silently went missing.
Text before the first `diff --git` line (a mail header, a commit message) is ignored, as `git apply` does.

A pure rename (`similarity index 100%`) shows no mode in git's output, so the diff cannot tell whether the
renamed file is a symlink: old_mode/new_mode stay None (unknown). `changes_from_git` fills them in.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchedFile

from gatekeeper.changes import SYMLINK_MODE, ChangeSet, FileChange, FileStatus
from gatekeeper.errors import InputError

_GIT_HEADER = "diff --git "
_NO_NEWLINE = "\\ No newline at end of file"

# Every line git prints outside a hunk. Anything else there means the diff is not what it claims to be.
_HEADER_LINE = re.compile(
    r"(?:old mode|new mode|deleted file mode|new file mode) [0-7]{6}"
    r"|(?:copy|rename) (?:from|to) .+"
    r"|(?:dis)?similarity index \d{1,3}%"
    r"|index [0-9a-f]+\.\.[0-9a-f]+(?: [0-7]{6})?"
    r"|--- .+|\+\+\+ .+"
    r"|Binary files .+ differ"
    r"|GIT binary patch"
)
# Inside a `GIT binary patch` block: `literal N` / `delta N` and base85 data lines (git's alphabet).
_BINARY_PATCH_LINE = re.compile(r"(?:literal|delta) \d+|[A-Za-z][0-9A-Za-z!#$%&()*+\-;<=>?@^_`{|}~]+")
_MODE_LINE = re.compile(r"(old mode|new mode|deleted file mode|new file mode) ([0-7]{6})")
_INDEX_LINE = re.compile(r"index [0-9a-f]+\.\.[0-9a-f]+ ([0-7]{6})")
_PATH_LINE = re.compile(r"(rename from|rename to|copy from|copy to) (.+)")

_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def changes_from_diff(text: str, source: str) -> ChangeSet:
    """Every file of a git-format unified diff as a FileChange. Errors name `source` and the diff line."""
    return ChangeSet(source="diff", files=tuple(parse_git_diff(text, source)))


def parse_git_diff(text: str, source: str) -> list[FileChange]:
    lines = _split_lines(text)
    patch = _parse(lines, source, "diff")
    if not patch:
        if text.strip():
            raise InputError(source, "no 'diff --git' file header found: not a git-format diff", 1)
        return []
    # Hunk bodies never start with "diff --git " (they start with ' ', '+', '-' or '\\').
    git_header_line_nos = [no for no, line in enumerate(lines, start=1) if line.startswith(_GIT_HEADER)]
    if len(patch) != len(git_header_line_nos):
        # unidiff also starts files at bare `---`/`+++` or `Binary files` lines; git never does.
        raise InputError(source, "a file section without a 'diff --git' header: not a git-format diff")
    _check_nothing_outside_hunks(lines, patch, source, git_header_line_nos)
    return [_file_change(patched, source, line_no) for patched, line_no in zip(patch, git_header_line_nos)]


def hunk_line_numbers(patched: PatchedFile) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(added line numbers in the new file, removed line numbers in the old file) of a parsed file."""
    added: list[int] = []
    removed: list[int] = []
    for hunk in patched:
        for line in hunk:
            # line_type rather than the is_added/is_removed properties: this loop is the hot path of a
            # 3000-file pull request.
            if line.line_type == "+":
                added.append(line.target_line_no)
            elif line.line_type == "-":
                removed.append(line.source_line_no)
    return tuple(added), tuple(removed)


# A synthetic file header, so that unidiff sees bare hunks as one file; it shifts line numbers by 2.
_SYNTHETIC_HEADER = ["--- a/file\n", "+++ b/file\n"]


def parse_hunks(patch: str, source: str) -> PatchedFile:
    """Parse bare hunks (GitHub's `patch` field: no file header) as one file. Every line must be hunk text."""
    if not patch.startswith("@@ "):
        raise InputError(source, f"a patch must start with a '@@ ' hunk header, not {patch[:40]!r}", 1)
    lines = _SYNTHETIC_HEADER + _split_lines(patch if patch.endswith("\n") else patch + "\n")
    parsed = _parse(lines, source, "patch", skipped=len(_SYNTHETIC_HEADER))
    # unidiff appends every line it reads inside a hunk (markers and blank lines too) to that hunk, and
    # files anything else as patch info: so every line is accounted for exactly when the sums agree.
    if sum(len(hunk) + 1 for hunk in parsed[0]) != len(lines) - len(_SYNTHETIC_HEADER):
        consumed = _hunk_line_nos(parsed)
        for line_no, line in enumerate(lines, start=1):
            outside = line_no > len(_SYNTHETIC_HEADER) and line_no not in consumed
            if outside and line.rstrip("\r\n") not in (_NO_NEWLINE, ""):
                raise InputError(source, f"line outside any hunk: {line.rstrip()!r}", line_no - len(_SYNTHETIC_HEADER))
    return parsed[0]


def _split_lines(text: str) -> list[str]:
    # StringIO splits on "\n" only; str.splitlines would also split on \x0b, \x1c, U+2028 inside content.
    return list(io.StringIO(text))


def _parse(lines: list[str], source: str, what: str, skipped: int = 0) -> PatchSet:
    try:
        return PatchSet(lines)
    except UnidiffParseError as exc:
        error = exc
    # unidiff does not say where it stopped: parse again, counting the lines it pulls (errors only).
    pulled = 0

    def counted() -> Iterator[str]:
        nonlocal pulled
        for line in lines:
            pulled += 1
            yield line

    try:
        PatchSet(counted())
    except UnidiffParseError:
        pass
    raise InputError(source, f"malformed {what}: {error}".rstrip(), max(pulled - skipped, 1)) from None


def _hunk_line_nos(patch: PatchSet) -> set[int]:
    """Diff line numbers unidiff consumed as hunk headers or hunk bodies."""
    consumed: set[int] = set()
    for patched in patch:
        for hunk in patched:
            numbered = [line.diff_line_no for line in hunk if line.diff_line_no is not None]
            if numbered:
                consumed.add(min(numbered) - 1)  # the `@@` header sits right above the first body line
                consumed.update(numbered)
    return consumed


def _check_nothing_outside_hunks(
    lines: list[str], patch: PatchSet, source: str, git_header_line_nos: list[int]
) -> None:
    consumed = _hunk_line_nos(patch)
    in_binary_patch = in_signature = False
    for line_no, raw in enumerate(lines, start=1):
        if line_no < git_header_line_nos[0] or line_no in consumed:
            continue
        line = raw.rstrip("\r\n")
        if line.startswith(_GIT_HEADER):
            in_binary_patch = in_signature = False
        elif line == "-- " or in_signature:
            in_signature = True  # `git format-patch` ends with a "-- " line and the git version
        elif line == "GIT binary patch":
            in_binary_patch = True
        elif line == "" or line == _NO_NEWLINE:
            pass
        elif in_binary_patch and _BINARY_PATCH_LINE.fullmatch(line):
            pass
        elif not _HEADER_LINE.fullmatch(line):
            raise InputError(source, f"line outside any hunk or git header: {line[:80]!r}", line_no)


@dataclass
class _Header:
    """What a file's git extended header says."""

    line_no: int
    git_line: str = ""
    modes: dict[str, str] = field(default_factory=dict)  # "old mode" / "new file mode" / ... -> mode
    index_mode: str | None = None
    moves: dict[str, str] = field(default_factory=dict)  # "rename from" / "copy to" / ... -> unquoted path


def _read_header(patched: PatchedFile, source: str, line_no: int) -> _Header:
    header = _Header(line_no=line_no)
    for raw in patched.patch_info or ():
        line = raw.rstrip("\r\n")
        if line.startswith(_GIT_HEADER):
            header.git_line = line
        elif match := _MODE_LINE.fullmatch(line):
            _set_once(header.modes, match[1], match[2], source, line_no)
        elif match := _INDEX_LINE.fullmatch(line):
            header.index_mode = match[1]
        elif match := _PATH_LINE.fullmatch(line):
            _set_once(header.moves, match[1], _unquote(match[2], source, line_no), source, line_no)
    return header


def _set_once(values: dict[str, str], key: str, value: str, source: str, line_no: int) -> None:
    if key in values:
        raise InputError(source, f"'{key}' appears twice in one file header", line_no)
    values[key] = value


def _file_change(patched: PatchedFile, source: str, line_no: int) -> FileChange:
    header = _read_header(patched, source, line_no)
    status, old_path, path = _status_and_paths(header, source)
    old_mode, new_mode = _modes(header, status, source)
    added, removed = hunk_line_numbers(patched)
    binary = bool(patched.is_binary_file)
    shows_link = new_mode == SYMLINK_MODE and status != FileStatus.removed
    return FileChange(
        path=path,
        old_path=old_path,
        status=status,
        added_lines=added,
        removed_lines=removed,
        binary=binary,
        old_mode=old_mode,
        new_mode=new_mode,
        symlink_target=_symlink_target(patched) if shows_link else None,
        # A binary diff shows no lines, so which lines changed is unknown.
        has_patch=not binary,
    )


def _status_and_paths(header: _Header, source: str) -> tuple[FileStatus, str | None, str]:
    moves = header.moves
    for kind, status in (("rename", FileStatus.renamed), ("copy", FileStatus.copied)):
        if f"{kind} from" in moves or f"{kind} to" in moves:
            if f"{kind} from" not in moves or f"{kind} to" not in moves:
                raise InputError(source, f"'{kind} from' and '{kind} to' must come together", header.line_no)
            return status, moves[f"{kind} from"], moves[f"{kind} to"]
    old, new = _git_line_paths(header.git_line, source, header.line_no)
    if old != new:
        raise InputError(source, "'diff --git' names two paths but the header has no rename or copy", header.line_no)
    if "new file mode" in header.modes:
        return FileStatus.added, None, new
    if "deleted file mode" in header.modes:
        return FileStatus.removed, None, old
    return FileStatus.modified, None, new


def _modes(header: _Header, status: FileStatus, source: str) -> tuple[str | None, str | None]:
    modes = header.modes
    if "new file mode" in modes and "deleted file mode" in modes:
        raise InputError(source, "a file header cannot both create and delete the file", header.line_no)
    if status == FileStatus.added:
        return None, modes["new file mode"]
    if status == FileStatus.removed:
        return modes["deleted file mode"], None
    old_mode = modes.get("old mode", header.index_mode)
    new_mode = modes.get("new mode", header.index_mode)
    if ("old mode" in modes) != ("new mode" in modes):
        raise InputError(source, "'old mode' and 'new mode' must come together", header.line_no)
    return old_mode, new_mode


def _symlink_target(patched: PatchedFile) -> str | None:
    """A symlink's blob is its target; the diff shows it whole when the hunk covers the new file."""
    new_side = [line.value for hunk in patched for line in hunk if line.target_line_no is not None]
    if not new_side or patched[0].target_start != 1:
        return None
    target = "".join(new_side)
    return target[:-1] if target.endswith("\n") else target


def _git_line_paths(git_line: str, source: str, line_no: int) -> tuple[str, str]:
    """The two paths of `diff --git a/X b/Y`. Unquoted names with spaces are ambiguous unless X == Y."""
    rest = git_line[len(_GIT_HEADER):]
    if rest.startswith('"'):  # git quotes both names or neither when they are the same path
        end = _closing_quote(rest, source, line_no)
        if rest[end + 1 : end + 2] != " ":
            raise InputError(source, f"expected a space after the first path of {git_line!r}", line_no)
        old, new = _unquote(rest[: end + 1], source, line_no), _unquote(rest[end + 2 :], source, line_no)
    else:
        half = (len(rest) - 1) // 2
        old, new = rest[:half], rest[half + 1 :]
        if rest[half : half + 1] != " " or old[2:] != new[2:]:
            raise InputError(source, f"cannot tell the two paths apart in {git_line!r}", line_no)
    if not old.startswith("a/") or not new.startswith("b/"):
        raise InputError(source, f"expected 'a/' and 'b/' path prefixes in {git_line!r}", line_no)
    return old[2:], new[2:]


def _closing_quote(text: str, source: str, line_no: int) -> int:
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    raise InputError(source, f"unterminated quoted path in {text!r}", line_no)


def _unquote(name: str, source: str, line_no: int) -> str:
    """Undo git's C-style path quoting (core.quotePath): `"a/t\\303\\251st"` -> `a/tést`."""
    if not (len(name) >= 2 and name.startswith('"') and name.endswith('"')):
        return name
    body = name[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out += char.encode("utf-8")
            i += 1
            continue
        escape = body[i + 1 : i + 2]
        if escape in _C_ESCAPES:
            out.append(_C_ESCAPES[escape])
            i += 2
        elif re.fullmatch(r"[0-3][0-7]{2}", body[i + 1 : i + 4]):
            out.append(int(body[i + 1 : i + 4], 8))
            i += 4
        else:
            raise InputError(source, f"bad escape in quoted path {name!r}", line_no)
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(source, f"quoted path {name!r} is not valid UTF-8", line_no) from None
