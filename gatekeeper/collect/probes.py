"""Run the guard probes and read the support matrix axes in a child process with a time limit.

The code under review is imported only there: a guard that hangs, crashes the interpreter or prints is
recorded as a failed probe run, and the collector goes on. The probes of every package of a policy run in one
child process (importing vLLM costs seconds; it is paid once).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from gatekeeper.collect.process import run_limited
from gatekeeper.errors import InputError
from gatekeeper.evidence import GuardProbeRun, Origin, ProbeResult, SupportAxes, clip
from gatekeeper.policy import StartupGuardSettings

Outcome = tuple[GuardProbeRun | None, SupportAxes | None]


def run_probes(settings: StartupGuardSettings, repo: Path, work: Path, origin: Origin,
               policy_dir: Path | None = None) -> Outcome:
    """Probe results (None when the policy names no guard) and support axes (None when it names no matrix).
    `policy_dir` is where a `vllm_model` path is relative to (the policy file's directory)."""
    return run_probe_jobs({"": settings}, repo, work, origin, policy_dir)[""]


def run_probe_jobs(jobs: dict[str, StartupGuardSettings], repo: Path, work: Path, origin: Origin,
                   policy_dir: Path | None = None, pythonpath: tuple[Path, ...] = ()) -> dict[str, Outcome]:
    """`run_probes` for several packages (name -> guard settings) in one child process. `pythonpath` goes before
    `repo` on the child's sys.path (the tests put a mutated copy of a package there)."""
    work.mkdir(parents=True, exist_ok=True)
    wanted = {name: s for name, s in jobs.items() if s.guard is not None or s.support_matrix is not None}
    if not wanted:
        return {name: (None, None) for name in jobs}
    answer = work / "probes.json"
    requests, assumptions = {}, {}
    for index, (name, settings) in enumerate(wanted.items()):
        requests[name], assumptions[name] = _request(settings, policy_dir, work / f"job-{index}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*map(str, pythonpath), str(repo), env.get("PYTHONPATH")) if p)
    # A probe builds configs from local files only: nothing may be fetched from a model hub.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # Run as a script, so the child imports nothing of the gatekeeper (fast, and nothing to shadow the code under review).
    runner = Path(__file__).parent / "plugin" / "gatekeeper_probe_runner.py"
    timeout_s = sum(s.timeout_s for s in wanted.values())
    finished = run_limited([sys.executable, str(runner)], cwd=repo, env=env, timeout_s=timeout_s,
                           log=work / "probes.log", stdin=json.dumps({"jobs": requests, "out": str(answer)}).encode())
    failure = None
    if finished.timed_out:
        failure = f"timed out after {timeout_s:g} s; last output:\n{finished.tail}"
    elif finished.returncode != 0 or not answer.exists():
        failure = f"the probe process exited with status {finished.returncode}; last output:\n{finished.tail}"
    answers = {} if failure else json.loads(answer.read_text(encoding="utf-8"))
    out: dict[str, Outcome] = {name: (None, None) for name in jobs}
    for name, settings in wanted.items():
        out[name] = _outcome(settings, answers.get(name, {}), failure, origin, assumptions[name])
    return out


def _request(settings: StartupGuardSettings, policy_dir: Path | None, work: Path) -> tuple[dict, tuple[str, ...]]:
    request = {
        "guard": settings.guard if settings.probes else None,
        "deployment_factory": settings.deployment_factory,
        "support_matrix": settings.support_matrix,
        "probes": [{"name": p.name, "deployment": {**settings.probe_defaults, **p.deployment}} for p in settings.probes],
    }
    assumptions: tuple[str, ...] = ()
    if settings.probe_builder == "vllm" and settings.probes:
        request.update(builder="vllm", vllm_model=str(_model_dir(settings.vllm_model, policy_dir, work)))
        assumptions = ("VllmConfig built on the CPU, the platform faked to each probe's arch "
                       "(device capability, ROCm gfx flags, compute units)",)
    return request, assumptions


def _outcome(settings: StartupGuardSettings, data: dict, failure: str | None, origin: Origin,
             assumptions: tuple[str, ...]) -> Outcome:
    probes = None
    if settings.guard is not None and settings.probes:
        error = failure or data.get("probes_error")
        results = () if error else tuple(ProbeResult.model_validate(r) for r in data["probes"]["results"])
        probes = GuardProbeRun(origin=origin, guard=settings.guard, error=_cap(error), results=results,
                               assumptions=assumptions)
    axes = None
    if settings.support_matrix is not None:
        error = failure or data.get("support_axes_error")
        axes = SupportAxes(origin=origin, source=settings.support_matrix, error=_cap(error),
                           axes=None if error else data["support_axes"])
    return probes, axes


def _model_dir(config: str, policy_dir: Path | None, work: Path) -> Path:
    """A directory holding the policy's HF config.json for `vllm_model` (vLLM reads a model from a directory)."""
    source = Path(config) if policy_dir is None else policy_dir / config
    if not source.is_file():
        raise InputError(str(source), "checks.startup_guard.vllm_model: no such file (an HF config.json, relative to the policy)")
    target = work / "vllm-model"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target / "config.json")
    return target


def _cap(message: str | None) -> str | None:
    return None if message is None else clip(message)
