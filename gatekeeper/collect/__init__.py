"""The collector: everything that executes the code under review, run in CI, never in the App.

`collect()` runs the policy's tests under coverage (per-test contexts) and JUnit, runs the guard probes and
reads the support matrix in a child process, attaches GPU reports and perf evidence, and records the head's
ancestry: one `Evidence` document for `gatekeeper check --evidence`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rich.console import Console

from gatekeeper.checks.startup_guard import module_path
from gatekeeper.collect.gpu_reports import load_gpu_reports
from gatekeeper.collect.probes import run_probe_jobs
from gatekeeper.collect.testrun import run_tests
from gatekeeper.errors import InputError
from gatekeeper.evidence import (Evidence, GuardProbeRun, HeadInfo, Origin, PackageEvidence, PerfSubmission, SupportAxes,
                                 TestRun, load_perf_evidence)
from gatekeeper.git import Git, ancestors, commits_changing, export_tree
from gatekeeper.paths import matches_any
from gatekeeper.policy import LoadedPolicy, Package, Policy, StartupGuardSettings
from gatekeeper.sources.git import GitSnapshot, changes_from_git

# How far back the head's ancestry is recorded when the policy allows no window: enough for a report to
# say how stale evidence is.
MIN_ANCESTORS = 20
# ... and when only commits changing the owned paths age evidence (commit_window_counts: owned).
OWNED_WINDOW_ANCESTORS = 500


def collect(loaded: LoadedPolicy, repo: Path, base: str, perf_files: tuple[Path, ...] = (),
            console: Console | None = None) -> Evidence:
    console = console or Console(stderr=True)
    policy = loaded.policy
    repo = repo.resolve()
    origin = collector_origin()
    head = GitSnapshot(repo, "HEAD")
    evidence: dict = {"head": head_info(policy, repo, head.sha)}
    packages = _packages_to_collect(policy, repo, base, console)
    parts: dict[str, dict] = {package.name: {} for package in packages}
    with tempfile.TemporaryDirectory(prefix="gatekeeper-collect-") as tmp:
        if policy.checks.changed_path_tests.enabled:
            for package in packages:
                (Path(tmp) / f"tests-{package.name}").mkdir()
                view = loaded.model_copy(update={"policy": policy.for_package(package)})
                parts[package.name]["tests"] = _test_runs(view, repo, base, head, Path(tmp) / f"tests-{package.name}",
                                                          origin, console)
        if policy.checks.startup_guard.enabled:
            _guard_probes(loaded, packages, repo, base, Path(tmp), origin, console, parts)
    if policy.checks.startup_guard.enabled:
        evidence["head_sources"] = guard_sources(policy, packages, head)
    if policy.packages:
        evidence["packages"] = {name: PackageEvidence(**part) for name, part in parts.items()}
    else:
        evidence.update(next(iter(parts.values()), {}))
    evidence["perf"] = tuple(
        PerfSubmission(origin=Origin(trust=origin.trust, source=f"CI artifact {path}"), evidence=load_perf_evidence(path))
        for path in perf_files
    ) + _committed_perf(policy, packages, repo, head, console)
    return Evidence(**evidence)


def _committed_perf(policy: Policy, packages: tuple[Package, ...], repo: Path, head: GitSnapshot,
                    console: Console) -> tuple[PerfSubmission, ...]:
    """The perf evidence files the change commits (evidence_globs), attached labelled self-reported: so that a
    verdict made from the PR's files alone (no checkout) sees them too."""
    if not policy.checks.perf_matrix.enabled:
        return ()
    globs = {g for p in packages for g in policy.for_package(p).checks.perf_matrix.evidence_globs}
    attached = []
    for path in sorted(p for p in head.paths() if globs and matches_any(p, tuple(globs))):
        try:
            found = load_perf_evidence(repo / path)
        except InputError as exc:
            console.print(f"[red]✗[/] committed perf evidence {path} is unusable: {exc.reason} (the check reports it)")
            continue
        attached.append(PerfSubmission(origin=Origin(trust="self_reported", source=f"PR file {path}"), evidence=found))
    if attached:
        console.print(f"attached {len(attached)} committed perf file(s), labelled self-reported")
    return tuple(attached)


def guard_sources(policy: Policy, packages: tuple[Package, ...], head: GitSnapshot) -> dict[str, str]:
    """The head's text of every module the static startup-guard check reads: the guards, their entry points,
    the support matrices."""
    sources = {}
    for package in packages:
        guard = policy.for_package(package).checks.startup_guard
        for ref in (guard.guard, guard.support_matrix, *guard.called_from):
            path = module_path(head, ref.rpartition(":")[0]) if ref else None
            text = head.read(path) if path is not None else None
            if text is not None:
                sources[path] = text
    return sources


def _packages_to_collect(policy: Policy, repo: Path, base: str, console: Console) -> tuple[Package, ...]:
    """The packages the change touches (each runs its own tests and probes); every package when the change
    cannot be listed (a shallow clone) or touches none of them."""
    packages = policy.package_list()
    if not policy.packages:
        return packages
    try:
        paths = [p for f in changes_from_git(repo, base).files for p in f.paths]
    except InputError as exc:
        console.print(f"[yellow]warning:[/] cannot diff against {base} ({exc.reason}); collecting every package")
        return packages
    touched = tuple(pkg for pkg in packages if any(matches_any(p, pkg.owned_paths) for p in paths))
    console.print(f"packages touched: {', '.join(p.name for p in touched) or 'none (collecting every package)'}")
    return touched or packages


def _guard_probes(loaded: LoadedPolicy, packages: tuple[Package, ...], repo: Path, base: str, tmp: Path,
                  origin: Origin, console: Console, parts: dict[str, dict]) -> None:
    """Every package's probes and matrix at the head, then at the base (for the blast radius: what the head
    admits that the base did not), each side in one child process."""
    policy = loaded.policy
    jobs = {p.name: policy.for_package(p).checks.startup_guard for p in packages}
    policy_dir = Path(loaded.source).resolve().parent
    with console.status("Running the guard probes in a child process…"):
        at_head = run_probe_jobs(jobs, repo, tmp / "probes-head", origin, policy_dir)
    base_sha = Git(repo).commit_sha_or_none(base)
    at_base: dict = {}
    if base_sha is not None and export_tree(repo, base_sha, tmp / "base"):
        # A guard the base does not have (a new package) must not be imported from wherever else it is installed.
        at_base = {name: _absent_at_base(settings, origin) for name, settings in jobs.items()
                   if _missing_modules(settings, GitSnapshot(repo, base_sha))}
        present = {name: settings for name, settings in jobs.items() if name not in at_base}
        with console.status(f"Running the guard probes at the base {base_sha[:12]}…"):
            at_base.update(run_probe_jobs(present, tmp / "base", tmp / "probes-base", origin, policy_dir))
    else:
        console.print(f"[yellow]warning:[/] the base {base} is not in this clone: no blast-radius comparison")
    for name, (probes, axes) in at_head.items():
        parts[name].update(guard_probes=probes, support_axes=axes)
        parts[name].update(zip(("base_guard_probes", "base_support_axes"), at_base.get(name, (None, None))))
        label = f"{name}: " if policy.packages else ""
        if probes is not None:
            _say(console, probes.error is None, f"{label}guard probes: {len(probes.results)} ran"
                 + (f"; {probes.error.splitlines()[-1]}" if probes.error else ""))
        if axes is not None:
            _say(console, axes.error is None, f"{label}support matrix axes: {axes.error or ', '.join(axes.axes)}")


def _missing_modules(settings: StartupGuardSettings, base: GitSnapshot) -> list[str]:
    return [ref.rpartition(":")[0] for ref in (settings.guard, settings.support_matrix)
            if ref and module_path(base, ref.rpartition(":")[0]) is None]


def _absent_at_base(settings: StartupGuardSettings, origin: Origin) -> tuple[GuardProbeRun | None, SupportAxes | None]:
    why = "not in the base commit (a new package?): nothing to compare with"
    probes = GuardProbeRun(origin=origin, guard=settings.guard, error=f"{settings.guard}: {why}") \
        if settings.guard and settings.probes else None
    axes = SupportAxes(origin=origin, source=settings.support_matrix, error=f"{settings.support_matrix}: {why}") \
        if settings.support_matrix else None
    return probes, axes


def head_info(policy: Policy, repo: Path, sha: str) -> HeadInfo:
    """The head, its ancestry as far as the perf commit window can reach, and (commit_window_counts: owned) the
    commits in it that change the owned paths (or the window's own paths, commit_window_paths)."""
    settings = policy.checks.perf_matrix
    if settings.commit_window_counts == "owned":
        paths = settings.commit_window_paths or policy.owned_paths
        owned = commits_changing(repo, sha, settings.commit_window + 1, paths)
        return HeadInfo(sha=sha, ancestors=ancestors(repo, sha, OWNED_WINDOW_ANCESTORS), owned_changes=owned)
    return HeadInfo(sha=sha, ancestors=ancestors(repo, sha, max(settings.commit_window, MIN_ANCESTORS)))


def _test_runs(loaded: LoadedPolicy, repo: Path, base: str, head: GitSnapshot, work: Path, origin: Origin,
               console: Console) -> tuple[TestRun, ...]:
    """The collector's own test run, then the GPU reports the pull request attaches."""
    policy = loaded.policy
    settings = policy.checks.changed_path_tests
    paths = measured_paths(repo, base, head, policy.owned_paths, settings.exclude_paths, console)
    with console.status(f"Running {' '.join(settings.command)} under coverage ({len(paths)} file(s) measured)…"):
        run = run_tests(settings.command, repo, work, paths, settings.timeout_s, origin, loaded.source)
    failed = sum(t.outcome in ("failed", "error") for t in run.tests)
    _say(console, run.error is None and not failed,
         f"tests: {len(run.tests)} ran, {failed} failed" + (f"; {run.error.splitlines()[0]}" if run.error else ""))
    reports = load_gpu_reports(repo, head, head.sha, settings.gpu_report_globs, paths)
    if reports:
        console.print(f"attached {len(reports)} GPU report(s), labelled self-reported")
    return (run, *reports)


def collector_origin() -> Origin:
    """Whatever this process measured itself is trusted; the source says where it ran, for the report."""
    if os.environ.get("GITHUB_ACTIONS") == "true":
        workflow = os.environ.get("GITHUB_WORKFLOW_REF") or os.environ.get("GITHUB_WORKFLOW", "?")
        return Origin(trust="trusted", source=f"gatekeeper collect in GitHub Actions ({workflow}, run {os.environ.get('GITHUB_RUN_ID', '?')})")
    return Origin(trust="trusted", source="gatekeeper collect (local run)")


def measured_paths(repo: Path, base: str, head: GitSnapshot, owned: tuple[str, ...], exclude: tuple[str, ...],
                   console: Console) -> list[str]:
    """The owned Python files changed since `base` (what changed_path_tests judges); every owned Python file
    when `base` cannot be resolved (a shallow clone), which costs size but loses nothing."""
    try:
        changed = [f.path for f in changes_from_git(repo, base).files if f.status.value != "removed"]
    except InputError as exc:
        console.print(f"[yellow]warning:[/] cannot diff against {base} ({exc.reason}); measuring every owned file")
        changed = list(head.paths())
    return sorted(p for p in changed if p.endswith(".py") and matches_any(p, owned) and not matches_any(p, exclude)
                  and (repo / p).is_file())


def _say(console: Console, ok: bool, message: str) -> None:
    console.print(("[green]✓[/] " if ok else "[red]✗[/] ") + message)
