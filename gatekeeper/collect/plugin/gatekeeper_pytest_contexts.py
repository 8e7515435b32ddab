"""pytest plugin loaded by the collector (`-p gatekeeper_pytest_contexts`): labels coverage with the test's node id.

coverage.py's own `dynamic_context = test_function` names a test by its function's qualified name, which
loses parametrization and depends on how pytest imported the module; the node id is what JUnit and pytest
print, so the report can say exactly which test ran a line. Imports only pytest and coverage, so it works in
any environment that can run the project's tests under coverage.
"""

from __future__ import annotations

import coverage
import pytest


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
