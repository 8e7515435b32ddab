"""Semantic lint of a valid policy: rules that parse but cannot mean what their author wanted.

Pure: it reads the policy and, when given, the list of files in the repository. Each warning names the
field it is about (`loc`, as in pydantic errors) so the CLI can point at its YAML line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gatekeeper.paths import matches, matches_any
from gatekeeper.policy import Mode, Policy

_GLOB_CHARS = frozenset("*?[\\")


@dataclass(frozen=True)
class LintWarning:
    loc: tuple[str | int, ...]
    message: str

    @property
    def field(self) -> str:
        return ".".join(str(part) for part in self.loc)


def lint(policy: Policy, repo_paths: Iterable[str] | None = None) -> list[LintWarning]:
    """Warnings about duplicate and overlapping rules, rules that match nothing in the repository (only
    when `repo_paths` is given), and check settings that contradict each other."""
    paths = None if repo_paths is None else tuple(repo_paths)
    warnings: list[LintWarning] = []
    warnings += _duplicates(policy)
    warnings += _owned_overlaps(policy, paths)
    warnings += _touchpoint_overlaps(policy, paths)
    if paths is not None:
        warnings += _unmatched(policy, paths)
    warnings += _check_settings(policy)
    warnings += _package_overlaps(policy, paths)
    return [LintWarning(_package_loc(policy, w.loc), w.message) for w in warnings]


def _package_loc(policy: Policy, loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """With packages, the top-level owned paths are theirs, concatenated: point at the package's own entry."""
    if not policy.packages or loc[:1] != ("owned_paths",) or len(loc) < 2:
        return loc
    index = int(loc[1])
    for number, package in enumerate(policy.packages):
        if index < len(package.owned_paths):
            return ("packages", number, "owned_paths", index, *loc[2:])
        index -= len(package.owned_paths)
    return loc


def _package_overlaps(policy: Policy, paths: tuple[str, ...] | None) -> list[LintWarning]:
    """Two packages owning one file: a change to it is judged by both, which is rarely what was meant."""
    warnings = []
    for index, package in enumerate(policy.packages):
        for earlier in policy.packages[:index]:
            candidates = paths if paths is not None else tuple(g for g in package.owned_paths if _is_literal(g))
            shared = next((p for p in candidates if matches_any(p, package.owned_paths)
                           and matches_any(p, earlier.owned_paths)), None)
            if shared is not None:
                warnings.append(LintWarning(("packages", index, "owned_paths"), (
                    f"package {package.name!r} and package {earlier.name!r} both own {shared}: a change to it is "
                    "judged by both")))
    return warnings


def _is_literal(glob: str) -> bool:
    return not (_GLOB_CHARS & set(glob))


def _duplicates(policy: Policy) -> list[LintWarning]:
    warnings = []
    for name, values in (("owned_paths", policy.owned_paths), ("touchpoints", [t.path for t in policy.touchpoints])):
        first_index: dict[str, int] = {}
        for index, value in enumerate(values):
            if value in first_index:
                loc = (name, index) if name == "owned_paths" else (name, index, "path")
                warnings.append(LintWarning(loc, f"duplicate of {name}[{first_index[value]}] ({value!r})"))
            else:
                first_index[value] = index
    return warnings


def _owned_overlaps(policy: Policy, paths: tuple[str, ...] | None) -> list[LintWarning]:
    warnings = []
    owned = policy.owned_paths
    # Within one package: two packages owning the same file is _package_overlaps's warning.
    group = [0] * len(owned)
    if policy.packages:
        group = [number for number, package in enumerate(policy.packages) for _ in package.owned_paths]
    for index, glob in enumerate(owned):
        if glob in ("**", "**/*"):
            warnings.append(LintWarning(("owned_paths", index), f"{glob!r} owns every file: confinement can never fail"))
            continue
        others = [(j, other) for j, other in enumerate(owned) if j != index and other != glob and group[j] == group[index]]
        for j, other in others:
            if _subsumed(glob, other, paths):
                warnings.append(LintWarning(
                    ("owned_paths", index), f"{glob!r} adds nothing: every file it matches is owned through {other!r}"
                ))
                break
    return warnings


def _subsumed(glob: str, other: str, paths: tuple[str, ...] | None) -> bool:
    """Whether everything `glob` matches is matched by `other`: exact for a literal path, else judged on
    the repository's files (and then only when `glob` matches some)."""
    if _is_literal(glob):
        return matches(glob, other)
    if paths is None:
        return False
    matched = [p for p in paths if matches(p, glob)]
    return bool(matched) and all(matches(p, other) for p in matched)


def _touchpoint_overlaps(policy: Policy, paths: tuple[str, ...] | None) -> list[LintWarning]:
    warnings = []
    for index, touchpoint in enumerate(policy.touchpoints):
        loc = ("touchpoints", index, "path")
        candidates = (touchpoint.path,) if _is_literal(touchpoint.path) else tuple(
            p for p in paths or () if matches(p, touchpoint.path)
        )
        owned = next((p for p in candidates if matches_any(p, policy.owned_paths)), None)
        if owned is not None:
            warnings.append(LintWarning(
                loc, f"{touchpoint.path!r} overlaps the owned paths ({owned} is owned): its budget never applies there"
            ))
        for j, earlier in enumerate(policy.touchpoints[:index]):
            shared = next((p for p in candidates if earlier.path != touchpoint.path and matches(p, earlier.path)), None)
            if shared is not None:
                warnings.append(LintWarning(
                    loc, f"{touchpoint.path!r} overlaps touchpoints[{j}] ({earlier.path!r}) at {shared}: "
                    "only the first touchpoint's budget is charged",
                ))
    return warnings


def _unmatched(policy: Policy, paths: tuple[str, ...]) -> list[LintWarning]:
    warnings = []
    for index, glob in enumerate(policy.owned_paths):
        if not any(matches(p, glob) for p in paths):
            warnings.append(LintWarning(("owned_paths", index), f"{glob!r} matches no file in the repository"))
    for index, touchpoint in enumerate(policy.touchpoints):
        if not any(matches(p, touchpoint.path) for p in paths):
            warnings.append(LintWarning(
                ("touchpoints", index, "path"), f"{touchpoint.path!r} matches no file in the repository"
            ))
    owned = [p for p in paths if matches_any(p, policy.owned_paths)]
    for index, glob in enumerate(policy.checks.perf_matrix.commit_window_paths):
        if not any(matches(p, glob) for p in owned):
            warnings.append(LintWarning(
                ("checks", "perf_matrix", "commit_window_paths", index),
                f"{glob!r} matches no owned file: no change there can age the perf evidence",
            ))
    return warnings


def _check_settings(policy: Policy) -> list[LintWarning]:
    warnings = []
    enabled = policy.checks.enabled()
    # Only lists the author wrote: the defaults name checks that are disabled until a policy enables them.
    for field in sorted({"default_mode_checks", "require_trusted"} & policy.model_fields_set):
        for index, check in enumerate(getattr(policy, field)):
            if check not in enabled:
                warnings.append(LintWarning((field, index), f"{check} is disabled in checks, so this has no effect"))
    for index, package in enumerate(policy.package_list()):
        guard = policy.for_package(package).checks.startup_guard
        if guard.enabled and guard.guard is None:
            loc = ("packages", index, "startup_guard") if policy.packages else ("checks", "startup_guard", "guard")
            who = f"package {package.name!r}: " if policy.packages else ""
            warnings.append(LintWarning(loc, f"{who}startup_guard is enabled but names no guard: it can never pass"))
    detection = policy.agent_detection
    if detection.on_signal is Mode.default and detection.on_no_signal is Mode.strict:
        warnings.append(LintWarning(
            ("agent_detection", "on_signal"), "agent-assisted changes get a lighter review than the others"
        ))
    return warnings
