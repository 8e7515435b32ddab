"""pytest plugin loaded by the collector (`-p gatekeeper_pytest_contexts`): labels coverage with the test's node id.

coverage.py's own `dynamic_context = test_function` names a test by its function's qualified name, which
loses parametrization and depends on how pytest imported the module; the node id is what JUnit and pytest
print, so the report can say exactly which test ran a line. Imports only pytest and coverage, so it works in
any environment that can run the project's tests under coverage.

Under the collector it also has the Python processes a test starts measured: it points coverage.py's start-up
hook at the collector's child config and keeps the running test's node id in the environment, where that
config's `context = ${GATEKEEPER_TEST_CONTEXT-}` picks it up in each child (and grandchild).
"""

from __future__ import annotations

import os
from importlib import metadata

import coverage
import pytest

NODEIDS_ENV = "GATEKEEPER_NODEIDS"  # where to write the node ids of every collected test
# gatekeeper.collect.coverage_setup names these too (this plugin imports nothing of the gatekeeper).
CHILD_RCFILE_ENV = "GATEKEEPER_CHILD_RCFILE"
CONTEXT_ENV = "GATEKEEPER_TEST_CONTEXT"
NOTES_ENV = "GATEKEEPER_NOTES"  # where to write what the collector must report as not measured


def _switch(context: str) -> None:
    current = coverage.Coverage.current()
    if current is not None:
        current.switch_context(context)
    if CHILD_RCFILE_ENV in os.environ:
        os.environ[CONTEXT_ENV] = context


def pytest_configure(config):
    rcfile = os.environ.get(CHILD_RCFILE_ENV)
    if not rcfile:
        return
    if not _has_startup_hook() and os.environ.get(NOTES_ENV):
        with open(os.environ[NOTES_ENV], "a", encoding="utf-8") as notes:
            notes.write(f"coverage {coverage.__version__} in the test environment installs no .pth start-up hook: "
                        "code that child processes of the tests ran was not measured\n")
    # Set here rather than by the collector, so the pytest process itself does not start a second measurement.
    os.environ["COVERAGE_PROCESS_START"] = rcfile
    os.environ[CONTEXT_ENV] = ""  # processes started while collecting count as collection


def _has_startup_hook() -> bool:
    try:
        files = metadata.distribution("coverage").files or ()
    except metadata.PackageNotFoundError:
        return False
    return any(f.name.endswith(".pth") for f in files)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # Setup, call and teardown all count: a fixture that runs the changed code is part of the test.
    _switch(item.nodeid)
    yield
    _switch("")


def pytest_collection_finish(session):
    # Coverage only names the tests that ran measured code; JUnit names tests by class and name. This list
    # lets the collector give every test its node id.
    path = os.environ.get(NODEIDS_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write("\n".join(item.nodeid for item in session.items))
