"""Run the guard probes and read the support matrix axes in a child process with a time limit.

The code under review is imported only there: a guard that hangs, crashes the interpreter or prints is
recorded as a failed probe run, and the collector goes on.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gatekeeper.collect.process import run_limited
from gatekeeper.evidence import GuardProbeRun, Origin, ProbeResult, SupportAxes, clip
from gatekeeper.policy import StartupGuardSettings


def run_probes(settings: StartupGuardSettings, repo: Path, work: Path, origin: Origin) -> tuple[GuardProbeRun | None, SupportAxes | None]:
    """Probe results (None when the policy names no guard) and support axes (None when it names no matrix)."""
    if settings.guard is None and settings.support_matrix is None:
        return None, None
    answer = work / "probes.json"
    request = {
        "guard": settings.guard if settings.probes else None,
        "deployment_factory": settings.deployment_factory,
        "support_matrix": settings.support_matrix,
        "probes": [{"name": p.name, "deployment": p.deployment} for p in settings.probes],
        "out": str(answer),
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH")) if p)
    # Run as a script, so the child imports nothing of the gatekeeper (fast, and nothing to shadow the code under review).
    runner = Path(__file__).parent / "plugin" / "gatekeeper_probe_runner.py"
    finished = run_limited([sys.executable, str(runner)], cwd=repo, env=env,
                           timeout_s=settings.timeout_s, log=work / "probes.log", stdin=json.dumps(request).encode())
    failure = None
    if finished.timed_out:
        failure = f"timed out after {settings.timeout_s:g} s; last output:\n{finished.tail}"
    elif finished.returncode != 0 or not answer.exists():
        failure = f"the probe process exited with status {finished.returncode}; last output:\n{finished.tail}"
    data = {} if failure else json.loads(answer.read_text(encoding="utf-8"))
    probes = None
    if settings.guard is not None and settings.probes:
        error = failure or data.get("probes_error")
        results = () if error else tuple(ProbeResult.model_validate(r) for r in data["probes"]["results"])
        probes = GuardProbeRun(origin=origin, guard=settings.guard, error=_cap(error), results=results)
    axes = None
    if settings.support_matrix is not None:
        error = failure or data.get("support_axes_error")
        axes = SupportAxes(origin=origin, source=settings.support_matrix, error=_cap(error),
                           axes=None if error else data["support_axes"])
    return probes, axes


def _cap(message: str | None) -> str | None:
    return None if message is None else clip(message)
