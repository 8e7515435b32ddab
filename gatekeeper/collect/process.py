"""Run a child process with a time limit; on timeout kill its whole process group (pytest's workers too)."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

TAIL_CHARS = 3000


@dataclass(frozen=True)
class Finished:
    returncode: int | None  # None when it was killed for running past its limit
    timed_out: bool
    tail: str               # the end of its combined output, for the error message


def run_limited(argv: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float, log: Path,
                stdin: bytes | None = None) -> Finished:
    with open(log, "wb") as out:
        try:
            child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                     start_new_session=True)
        except OSError as exc:
            return Finished(None, False, f"cannot start {argv[0]}: {exc.strerror or exc}")
        try:
            child.communicate(stdin, timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(child.pid)  # also what the child left behind when it exited
        child.wait()
    text = log.read_bytes()[-TAIL_CHARS:].decode("utf-8", "replace")
    return Finished(None if timed_out else child.returncode, timed_out, text)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone
