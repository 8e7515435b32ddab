"""Blast radius: which deployments a change to an owned package can alter, and whether it widens what the
guard admits. Pure: it reads the policy, the change and the collector's evidence.

What the guard admits comes from the support matrix's axes (recorded by importing it) or, for a guard without
one (vLLM's), from the deployments of the probes it accepted. The collector runs both on the base commit too,
so a value admitted at the head but not at the base (a widened matrix) is told apart from a change that only
touches kernels.
"""

from __future__ import annotations

from typing import Any

from gatekeeper.changes import ChangeSet
from gatekeeper.evidence import Evidence, GuardProbeRun, SupportAxes
from gatekeeper.paths import matches_any
from gatekeeper.policy import Package, Policy, StartupGuardSettings
from gatekeeper.verdict import BlastRadius, ChangeKind

# Probe settings that say how a probe is run, not where the deployment lies: left out of the admitted matrix.
_NOT_AXES = frozenset({"additional_config", "env", "kernel", "attention", "compilation", "cache", "max_model_len"})


def touched_packages(policy: Policy, changes: ChangeSet) -> tuple[Package, ...]:
    """The owned packages a change touches (a renamed file touches the package of its old path too)."""
    paths = [p for change in changes.files for p in change.paths]
    return tuple(pkg for pkg in policy.package_list() if any(matches_any(p, pkg.owned_paths) for p in paths))


def blast_radius(policy: Policy, package: Package, changes: ChangeSet, evidence: Evidence | None) -> BlastRadius | None:
    """The blast radius of a change to `package`; None when its guard declares neither probes nor a matrix."""
    guard = policy.for_package(package).checks.startup_guard
    if guard.guard is None or not (guard.probes or guard.support_matrix):
        return None
    part = evidence.for_package(package.name) if evidence is not None else None
    head = admitted(guard, part.support_axes, part.guard_probes) if part is not None else {}
    others = tuple(p.name for p in policy.package_list() if p.name != package.name)
    fields: dict[str, Any] = {"package": package.name, "model": package.model, "admitted": head,
                              "untouched_packages": others}
    # A base run that failed (the package did not exist there, say) leaves the change unknown, not "the same".
    base_runs = [] if part is None else [r for r in (part.base_support_axes, part.base_guard_probes) if r is not None]
    if base_runs and all(r.error is None for r in base_runs):
        base = admitted(guard, part.base_support_axes, part.base_guard_probes)
        widened = _difference(head, base)
        narrowed = _difference(base, head)
        gained, lost = _flipped(part.base_guard_probes, part.guard_probes)
        fields.update(widened=widened, narrowed=narrowed, newly_accepted_probes=gained, newly_rejected_probes=lost)
        fields["change"] = _kind(widened or gained, narrowed or lost, _guard_touched(guard, changes))
    fields["statement"] = statement(package, head, others)
    return BlastRadius(**fields)


def admitted(guard: StartupGuardSettings, axes: SupportAxes | None, probes: GuardProbeRun | None) -> dict[str, tuple[Any, ...]]:
    """Axis -> the values the guard admits: the support matrix's axes when recorded, else the union of the
    deployments of the probes it accepted."""
    if axes is not None and axes.axes is not None:
        return {name: tuple(values) for name, values in axes.axes.items()}
    if probes is None or probes.error is not None:
        return {}
    declared = {p.name: {**guard.probe_defaults, **p.deployment} for p in guard.probes}
    # The axes are what the policy's probes vary (a setting every probe shares is how they are run, not an axis).
    varied = {k for p in guard.probes for k in p.deployment if k not in _NOT_AXES}
    values: dict[str, list[Any]] = {}
    for result in probes.results:
        if result.outcome != "accepted":
            continue
        deployment = {**declared.get(result.name, {}), **result.deployment}  # as built, where the builder says
        for name in sorted(varied, key=_axis_order):
            value = deployment.get(name)
            if name not in deployment or isinstance(value, (dict, list)):
                continue
            bucket = values.setdefault(name, [])
            if value not in bucket:
                bucket.append(value)
    return {name: tuple(_sorted(vs)) for name, vs in values.items()}


_ORDER = ("arch", "tp", "dcp", "pp", "dp", "spec", "spec_method", "spec_tokens", "batch", "max_batch", "context",
          "max_context")
# Axes whose admitted values are read as an upper bound ("batch <= 64"), not a list.
_UPPER_BOUNDS = frozenset({"batch", "max_batch", "context", "max_context"})


def _axis_order(name: str) -> tuple[int, str]:
    return (_ORDER.index(name) if name in _ORDER else len(_ORDER), name)


def _sorted(values: list[Any]) -> list[Any]:
    try:
        return sorted(values, key=lambda v: (v is None, v))
    except TypeError:
        return values


def _difference(a: dict[str, tuple[Any, ...]], b: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    """Per axis, the values of `a` that `b` lacks (an axis `b` lacks altogether is not compared: the other run
    did not record it)."""
    out = {}
    for name, values in a.items():
        if name in b:
            extra = tuple(v for v in values if str(v) not in {str(x) for x in b[name]})
            if extra:
                out[name] = extra
    return out


def _flipped(base: GuardProbeRun | None, head: GuardProbeRun | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if base is None or head is None or base.error or head.error:
        return (), ()
    before = {r.name: r.outcome for r in base.results}
    gained = tuple(r.name for r in head.results if r.outcome == "accepted" and before.get(r.name) == "raised")
    lost = tuple(r.name for r in head.results if r.outcome == "raised" and before.get(r.name) == "accepted")
    return gained, lost


def _kind(widens: Any, narrows: Any, guard_touched: bool) -> ChangeKind:
    if widens:
        return "widens"
    if narrows:
        return "narrows"
    return "guard_changed" if guard_touched else "kernel_only"


def _guard_touched(guard: StartupGuardSettings, changes: ChangeSet) -> bool:
    """Whether the change edits the module of the guard or of the support matrix."""
    modules = {ref.rpartition(":")[0] for ref in (guard.guard, guard.support_matrix) if ref}
    candidates = {f"{prefix}{m.replace('.', '/')}{suffix}" for m in modules for prefix in ("", "src/")
                  for suffix in (".py", "/__init__.py")}
    return any(p in candidates for change in changes.files for p in change.paths)


_LABELS = {"tp": "TP", "dcp": "DCP", "pp": "PP", "dp": "DP", "spec": "spec", "spec_method": "spec method",
           "spec_tokens": "spec tokens", "max_batch": "batch", "batch": "batch", "max_context": "context",
           "context": "context"}


def statement(package: Package, head: dict[str, tuple[Any, ...]], others: tuple[str, ...]) -> str:
    """One sentence a reviewer reads: who, on what, in which settings; and what cannot be affected."""
    who = package.model or package.name
    if not head:
        text = f"{who}: the admitted deployments are unknown (no probe accepted, no support matrix recorded)"
    else:
        parts = []
        for name, values in head.items():
            if name == "arch" or (name == "spec_tokens" and head.get("spec_method") == (None,)):
                continue
            if name == "spec_method" and values == (None,):
                parts.append("no speculative decoding")
                continue
            label = _LABELS.get(name, name.replace("_", " "))
            if name in _UPPER_BOUNDS and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                parts.append(f"{label} <= {max(values)}")
            else:
                parts.append(f"{label} {_either(values)}")
        arch = f" on {_either(head['arch'])}" if "arch" in head else ""
        text = f"{who}{arch}" + (", " + ", ".join(parts) if parts else "")
    if package.scope:
        text += f"; {package.scope}"
    return text + ("; every other package untouched (" + ", ".join(others) + ")" if others else "")


def _either(values: tuple[Any, ...]) -> str:
    shown = ["none" if v is None else str(v) for v in values]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
