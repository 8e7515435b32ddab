"""JUnit XML (pytest's `--junitxml`, or a GPU run's report) -> test outcomes.

A GPU report is committed in the pull request it judges, so its XML is untrusted: it is parsed with defusedxml,
which refuses entity and DTD tricks (billion laughs, external entities) instead of expanding them."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from gatekeeper.errors import InputError
from gatekeeper.evidence import MAX_MESSAGE_CHARS, TestCase

MAX_JUNIT_BYTES = 64 * 1024 * 1024


def junit_key(nodeid: str) -> str:
    """The "classname::name" pytest writes to JUnit for a node id (`tests/a/test_b.py::C::t[x]` ->
    `tests.a.test_b.C::t[x]`), so outcomes and coverage contexts can be joined."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return f"{'.'.join(names[:-1])}::{names[-1]}"


def parse_junit(path: Path, nodeids: dict[str, str] | None = None) -> tuple[TestCase, ...]:
    """Every <testcase> with its outcome. `nodeids` maps junit_key -> node id, to name tests by node id."""
    try:
        size = path.stat().st_size
        if size > MAX_JUNIT_BYTES:
            raise InputError(str(path), f"JUnit report is {size} bytes, more than the {MAX_JUNIT_BYTES}-byte limit")
        root = SafeET.parse(path, forbid_dtd=True).getroot()
    except OSError as exc:
        raise InputError(str(path), f"cannot read JUnit report: {exc.strerror or exc}") from None
    except DefusedXmlException as exc:
        raise InputError(str(path), f"unsafe JUnit XML refused ({type(exc).__name__}): a report needs no DTD or "
                                    "entities") from None
    except ET.ParseError as exc:
        raise InputError(str(path), f"invalid JUnit XML: {exc}", exc.position[0]) from None
    if root.tag not in ("testsuites", "testsuite"):
        raise InputError(str(path), f"not a JUnit report: the root element is <{root.tag}>", 1)
    nodeids = nodeids or {}
    cases = []
    for case in root.iter("testcase"):
        name = case.get("name")
        if not name:
            raise InputError(str(path), "a <testcase> has no name")
        classname = case.get("classname")
        key = f"{classname}::{name}" if classname else name  # pytest reports a collection error by module only
        outcome, message = _outcome(case)
        cases.append(TestCase(id=nodeids.get(key, key), outcome=outcome, message=message[:MAX_MESSAGE_CHARS]))  # the assertion comes first
    return tuple(cases)


def _outcome(case: ET.Element) -> tuple[str, str]:
    for tag, outcome in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        element = case.find(tag)
        if element is not None:
            text = (element.get("message") or "") + ("\n" + element.text if element.text else "")
            return outcome, text.strip()
    return "passed", ""
