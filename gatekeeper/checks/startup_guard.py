"""startup_guard: the specialized path refuses every unsupported deployment when the engine starts.

Static part (stdlib `ast`, nothing is executed): the guard function exists at the head; it raises the declared
exception, directly or through a helper of its module; every `called_from` entry point calls it before any
kernel build or allocation (the policy's `kernel_calls`); the support matrix is an object built in code.
Dynamic part: the probe results the collector recorded by running the guard in a subprocess.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from gatekeeper.checks import CheckContext
from gatekeeper.evidence import GuardProbeRun, ProbeResult
from gatekeeper.paths import matches_any
from gatekeeper.policy import GuardProbe, StartupGuardSettings
from gatekeeper.snapshot import Snapshot
from gatekeeper.verdict import CheckResult, Finding, Severity, Status

CHECK_ID = "startup_guard"


def run(ctx: CheckContext) -> CheckResult:
    settings = ctx.policy.policy.checks.startup_guard
    if settings.guard is None:
        return _result(Status.failed, "The policy enables startup_guard but names no guard.", [
            Finding(path=ctx.policy.source, message="set checks.startup_guard.guard to 'package.module:function'"),
        ])
    findings = [Finding(path=ctx.policy.source, severity=Severity.warning, message=message) for message in _unchecked(settings)]
    undecided: list[str] = []
    if ctx.snapshot is None:
        undecided.append("no snapshot of the head to read the guard's source from")
    else:
        findings += static_findings(ctx.snapshot, settings, ctx.policy.policy.owned_paths)
    probe_rows: list[dict[str, str]] = []
    if settings.probes:
        run_ = ctx.evidence.guard_probes if ctx.evidence is not None else None
        if run_ is None:
            undecided.append("no guard probe results in the evidence (run `gatekeeper collect`)")
        elif CHECK_ID in ctx.policy.policy.require_trusted and run_.origin.trust != "trusted":
            undecided.append(f"the guard probe results are self-reported ({run_.origin.source}); the policy requires trusted evidence")
        else:
            probe_findings, probe_rows = probe_verdicts(run_, settings)
            findings += probe_findings
    errors = [f for f in findings if f.severity is Severity.error]
    details = {"probes": probe_rows} if probe_rows else {}
    if errors:
        summary = f"{len(errors)} problem(s) with the startup guard {settings.guard}."
        return _result(Status.failed, summary, findings, details)
    if undecided:
        return _result(Status.neutral, "Not decided: " + "; ".join(undecided) + ".", findings, details)
    probes = f" and {len(settings.probes)} probe(s) behave as declared" if settings.probes else ""
    return _result(Status.passed, f"{settings.guard} exists, raises, runs first{probes}.", findings, details)


def _unchecked(settings: StartupGuardSettings) -> list[str]:
    """What the policy leaves unverified: said out loud, so a thin policy cannot pass as a thorough one."""
    gaps = []
    if settings.raises is None:
        gaps.append("the policy names no exception (raises): whether the guard raises is not checked")
    if not settings.called_from:
        gaps.append("the policy names no entry point (called_from): whether the guard runs at startup is not checked")
    if not settings.probes:
        gaps.append("the policy declares no probes: the guard is never run against a deployment")
    return gaps


def _result(status: Status, summary: str, findings: list[Finding], details: dict | None = None) -> CheckResult:
    return CheckResult(id=CHECK_ID, status=status, summary=summary, findings=tuple(findings), details=details or {})


# --- static -------------------------------------------------------------------------------------------


def static_findings(snapshot: Snapshot, settings: StartupGuardSettings, owned: tuple[str, ...] = ()) -> list[Finding]:
    findings: list[Finding] = []
    guard_module, guard_name = _split(settings.guard)
    guard_src = _load_module(snapshot, guard_module, findings, "guard")
    if guard_src is not None and owned and not matches_any(guard_src.path, owned):
        findings.append(Finding(path=guard_src.path, severity=Severity.warning, message=(
            "the guard lives outside the owned paths: the contribution does not own the code that bounds it"
        )))
    if guard_src is not None:
        guard_fn = guard_src.functions.get(guard_name)
        if guard_fn is None:
            findings.append(Finding(path=guard_src.path, message=f"the guard function {guard_name}() is not defined in {guard_module}"))
        elif settings.raises is not None:
            exc_name = _split(settings.raises)[1]
            if not guard_src.raises(guard_name, exc_name):
                findings.append(Finding(path=guard_src.path, line=guard_fn.lineno, message=(
                    f"{guard_name}() never raises {exc_name} (directly or through a helper in {guard_module})"
                )))
    for entry in settings.called_from:
        findings += _entry_point_findings(snapshot, entry, guard_name, settings.kernel_calls)
    if settings.support_matrix is not None:
        findings += _support_matrix_findings(snapshot, settings.support_matrix)
    return findings


def _entry_point_findings(snapshot: Snapshot, entry: str, guard_name: str, kernel_calls: tuple[str, ...]) -> list[Finding]:
    findings: list[Finding] = []
    module_name, function_name = _split(entry)
    source = _load_module(snapshot, module_name, findings, "entry point")
    if source is None:
        return findings
    function = source.functions.get(function_name)
    if function is None:
        return [Finding(path=source.path, message=f"the entry point {function_name}() is not defined in {module_name}")]
    # With no kernel patterns the first event can only be the guard: does the entry point call it at all?
    if source.first_event(function_name, guard_name, ()) is None:
        return [Finding(path=source.path, line=function.lineno, message=f"{function_name}() never calls the guard {guard_name}()")]
    kind, line, name = source.first_event(function_name, guard_name, kernel_calls)
    if kind == "kernel":
        return [Finding(path=source.path, line=line, message=(
            f"{function_name}() reaches {name}() (a kernel build or allocation) before it calls the guard {guard_name}()"
        ))]
    return []


# Built in code: a call, a literal container or a comprehension. A string (or f-string) is prose.
_MACHINE_READABLE = (ast.Call, ast.Dict, ast.List, ast.Tuple, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


def _support_matrix_findings(snapshot: Snapshot, ref: str) -> list[Finding]:
    findings: list[Finding] = []
    module_name, name = _split(ref)
    source = _load_module(snapshot, module_name, findings, "support matrix")
    if source is None:
        return findings
    value = source.assignments.get(name)
    if value is None:
        return [Finding(path=source.path, message=f"the support matrix {name} is not assigned at the top level of {module_name}")]
    if not isinstance(value, _MACHINE_READABLE):
        kind = "a string" if isinstance(value, (ast.Constant, ast.JoinedStr, ast.BinOp)) else type(value).__name__
        return [Finding(path=source.path, line=value.lineno, message=(
            f"the support matrix {name} is {kind}, not an object built in code (a call, dict, list or tuple)"
        ))]
    return []


def _split(ref: str) -> tuple[str, str]:
    module, _, name = ref.rpartition(":")
    return module, name


@dataclass
class _Source:
    """One parsed module: its functions ("f", "Class.m"), classes with base names, top-level assignments."""

    path: str
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    class_bases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    assignments: dict[str, ast.expr] = field(default_factory=dict)

    @classmethod
    def parse(cls, path: str, tree: ast.Module) -> _Source:
        source = cls(path)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                source.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                source.class_bases[node.name] = tuple(_last(_dotted(b)) for b in node.bases)
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        source.functions[f"{node.name}.{item.name}"] = item
            elif isinstance(node, ast.Assign) and node.value is not None:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        source.assignments[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                source.assignments[node.target.id] = node.value
        return source

    def _subclasses_of(self, exc_name: str) -> set[str]:
        """`exc_name` and every class of this module that derives from it (through bases of this module)."""
        names = {exc_name}
        changed = True
        while changed:
            changed = False
            for cls_name, bases in self.class_bases.items():
                if cls_name not in names and names.intersection(bases):
                    names.add(cls_name)
                    changed = True
        return names

    def raises(self, function_name: str, exc_name: str) -> bool:
        accepted = self._subclasses_of(exc_name)
        seen: set[str] = set()
        pending = [function_name]
        while pending:
            name = pending.pop()
            if name in seen or name not in self.functions:
                continue
            seen.add(name)
            for node in _own_nodes(self.functions[name]):
                if isinstance(node, ast.Raise) and node.exc is not None:
                    raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                    if _last(_dotted(raised)) in accepted:
                        return True
                elif isinstance(node, ast.Call):
                    pending.append(self._resolve(name, node))
        return False

    def first_event(self, function_name: str, guard_name: str, kernel_calls: tuple[str, ...],
                    seen: frozenset[str] = frozenset()) -> tuple[str, int, str] | None:
        """The first call, in source order, that is the guard or a kernel build, following same-module helpers.
        Returns ("guard" | "kernel", line in this function, call name) or None."""
        if function_name in seen:
            return None
        calls = sorted((n for n in _own_nodes(self.functions[function_name]) if isinstance(n, ast.Call)),
                       key=lambda n: (n.lineno, n.col_offset))
        for call in calls:
            name = _dotted(call.func)
            if _last(name) == guard_name:
                return "guard", call.lineno, name
            if _is_kernel_call(name, kernel_calls):
                return "kernel", call.lineno, name
            helper = self._resolve(function_name, call)
            if helper in self.functions:
                inner = self.first_event(helper, guard_name, kernel_calls, seen | {function_name})
                if inner is not None:
                    return inner[0], call.lineno, f"{name} -> {inner[2]}"
        return None

    def _resolve(self, caller: str, call: ast.Call) -> str:
        """The key in `functions` a call refers to: `helper(...)`, or `self.helper(...)` inside a method."""
        name = _dotted(call.func)
        if name.startswith(("self.", "cls.")) and "." in caller:
            return f"{caller.split('.')[0]}.{name.split('.', 1)[1]}"
        return name


def _own_nodes(function: ast.AST):
    """Every node of a function's body, not descending into nested functions, lambdas or classes
    (their code does not run when the function runs)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return "<expr>"


def _last(dotted: str) -> str:
    return dotted.rsplit(".", 1)[-1]


def _is_kernel_call(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(name, p) if "." in p else fnmatchcase(_last(name), p) for p in patterns)


def _load_module(snapshot: Snapshot, module: str, findings: list[Finding], role: str) -> _Source | None:
    path = module_path(snapshot, module)
    if path is None:
        findings.append(Finding(message=f"the {role} module {module} is not in the head of the repository"))
        return None
    text = snapshot.read(path)
    try:
        tree = ast.parse(text or "", filename=path)
    except SyntaxError as exc:
        findings.append(Finding(path=path, line=exc.lineno, message=f"the {role} module does not parse: {exc.msg}"))
        return None
    return _Source.parse(path, tree)


def module_path(snapshot: Snapshot, module: str) -> str | None:
    """The file of a dotted module at the head: `a/b.py` or `a/b/__init__.py`, at the root or under src/."""
    stem = module.replace(".", "/")
    paths = set(snapshot.paths())
    for prefix in ("", "src/"):
        for candidate in (f"{prefix}{stem}.py", f"{prefix}{stem}/__init__.py"):
            if candidate in paths:
                return candidate
    return None


# --- dynamic ------------------------------------------------------------------------------------------


def probe_verdicts(run_: GuardProbeRun, settings: StartupGuardSettings) -> tuple[list[Finding], list[dict[str, str]]]:
    """Judge the recorded probe results against the policy's probes; also the rows of the report table."""
    if run_.error is not None:
        return [Finding(message=f"the guard probes did not run: {run_.error}")], []
    results = {r.name: r for r in run_.results}
    findings: list[Finding] = []
    rows: list[dict[str, str]] = []
    for probe in settings.probes:
        result = results.get(probe.name)
        problem = "no result recorded" if result is None else _probe_problem(probe, result, settings.raises)
        if problem is not None:
            findings.append(Finding(message=f"probe {probe.name!r} (expect {probe.expect}): {problem}"))
        rows.append({
            "probe": probe.name,
            "expect": probe.expect,
            "got": "missing" if result is None else _describe(result),
            "ok": "yes" if problem is None else "no",
        })
    return findings, rows


def _probe_problem(probe: GuardProbe, result: ProbeResult, raises: str | None) -> str | None:
    if result.outcome == "error":
        return f"the deployment could not be built: {result.message}"
    if probe.expect == "accept":
        if result.outcome == "raised":
            return f"the guard rejected a supported deployment: {_describe(result)}"
        return None
    if result.outcome == "accepted":
        return "the guard accepted a deployment it must reject"
    if raises is not None and not _exception_matches(raises, result.exception_types):
        return f"raised {result.exception_types[0] if result.exception_types else 'an unknown type'}, not {raises}"
    missing = [name for name in probe.must_name if name.lower() not in result.message.lower()]
    if missing:
        return f"the message does not name {', '.join(missing)}: {result.message!r}"
    return None


def _exception_matches(declared: str, types: tuple[str, ...]) -> bool:
    """`module:Name` must match a qualified type exactly; a bare builtin such as `ValueError` matches by name."""
    if ":" in declared:
        return declared.replace(":", ".") in types
    return declared in types or f"builtins.{declared}" in types


def _describe(result: ProbeResult) -> str:
    if result.outcome != "raised":
        return result.outcome
    kind = result.exception_types[0] if result.exception_types else "exception"
    return f"raised {kind}: {result.message}"
