from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GATEKEEPER = Path(sys.executable).parent / "gatekeeper"

# Only confinement: these tests are about the command, not the evidence checks.
CONFINEMENT_POLICY = """\
version: 1
name: cli-test
owned_paths:
  - kimi_k3_path/**
  - tests/kimi_k3_path/**
touchpoints:
  - path: README.md
    max_added: 2
    max_removed: 0
"""


@pytest.fixture
def policy_file(tmp_path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(CONFINEMENT_POLICY)
    return path


def _gatekeeper(*args: str, cwd: Path = ROOT, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GATEKEEPER), *map(str, args)], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=60,
    )


@pytest.fixture
def gatekeeper():
    """The installed console script, end to end, as a user runs it."""
    return _gatekeeper


@pytest.fixture
def root() -> Path:
    return ROOT
