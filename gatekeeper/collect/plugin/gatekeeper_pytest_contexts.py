"""pytest plugin loaded by the collector (`-p gatekeeper_pytest_contexts`): labels coverage with the test's node id.

coverage.py's own `dynamic_context = test_function` names a test by its function's qualified name, which
loses parametrization and depends on how pytest imported the module; the node id is what JUnit and pytest
print, so the report can say exactly which test ran a line. Imports only pytest and coverage, so it works in
any environment that can run the project's tests under coverage.
"""

from __future__ import annotations

import os

import coverage
import pytest

NODEIDS_ENV = "GATEKEEPER_NODEIDS"  # where to write the node ids of every collected test


def _switch(context: str) -> None:
    current = coverage.Coverage.current()
    if current is not None:
        current.switch_context(context)


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
