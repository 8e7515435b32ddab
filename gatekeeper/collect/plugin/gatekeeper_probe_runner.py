"""Runs inside the child process the collector starts: imports the guard and the support matrix of the code
under review, hands each probe's deployment to the guard, and prints one JSON document on stdout.

Reads {"jobs": {name: {"guard", "deployment_factory", "support_matrix", "probes": [{"name", "deployment"}]}},
"out"} on stdin (one job per owned package) and writes {name: answer} to the file `out` (stdout belongs to the code under review, which may print). Only the
standard library is imported here, so it runs in whatever environment the project's code needs.

With "builder": "vllm" (and "vllm_model", a directory holding an HF config.json), each
deployment becomes vLLM's own VllmConfig built on the CPU with the platform faked to the probed GPU
(gatekeeper_vllm_deployments.py), and the guard is called with it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

MAX_MESSAGE = 4000  # gatekeeper.evidence.MAX_MESSAGE_CHARS (this script imports nothing of the gatekeeper)


def resolve(ref: str):
    """`package.module:name.attr` (or a builtin name) -> the object."""
    module_name, _, attr = ref.rpartition(":")
    target = importlib.import_module(module_name) if module_name else importlib.import_module("builtins")
    for part in attr.split("."):
        target = getattr(target, part)
    return target


def _type_names(exc: BaseException) -> list[str]:
    return [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__ if c not in (object, BaseException)]


def _build(factory, deployment: dict):
    if hasattr(factory, "model_validate"):  # a pydantic model: validate the dict as it is
        return factory.model_validate(deployment)
    return factory(**deployment)


def run_probes(request: dict) -> dict:
    guard = resolve(request["guard"])
    factory = resolve(request["deployment_factory"]) if request.get("deployment_factory") else None
    results = []
    for probe in request["probes"]:
        try:
            deployment = _build(factory, probe["deployment"]) if factory is not None else probe["deployment"]
        except Exception as exc:  # a probe the factory refuses is the policy's mistake: report it, go on
            results.append({"name": probe["name"], "outcome": "error", "message": f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE]})
            continue
        try:
            guard(deployment)
        except Exception as exc:
            results.append({"name": probe["name"], "outcome": "raised", "exception_types": _type_names(exc),
                            "message": str(exc)[:MAX_MESSAGE]})
        else:
            results.append({"name": probe["name"], "outcome": "accepted"})
    return {"results": results}


def run_vllm_probes(request: dict) -> dict:
    import gatekeeper_vllm_deployments as vllm_deployments  # next to this script; imports vllm

    guard = resolve(request["guard"])
    builder = vllm_deployments.Builder(request["vllm_model"])
    results = []
    for probe in request["probes"]:
        result = {"name": probe["name"]}
        try:
            with builder.deployment(probe["deployment"]) as config:
                result["deployment"] = {"arch": probe["deployment"].get("arch", "cpu"), **vllm_deployments.describe(config)}
                try:
                    guard(config)
                except Exception as exc:
                    result.update(outcome="raised", exception_types=_type_names(exc), message=str(exc)[:MAX_MESSAGE])
                else:
                    result["outcome"] = "accepted"
        except Exception as exc:  # vLLM refused to build the deployment: the policy's probe is wrong, say so
            if "outcome" not in result:
                result.update(outcome="error", message=f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE])
            else:
                raise
        results.append(result)
    return {"results": results}


def support_axes(ref: str) -> dict:
    matrix = resolve(ref)
    axes = matrix.perf_axes() if callable(getattr(matrix, "perf_axes", None)) else matrix
    if not isinstance(axes, dict):
        raise TypeError(f"{ref} has no perf_axes() and is not a dict of axis -> values")
    return {str(name): [_plain(v) for v in values] for name, values in axes.items()}


def _plain(value):
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def run_job(request: dict) -> dict:
    out: dict = {}
    if request.get("support_matrix"):
        try:
            out["support_axes"] = support_axes(request["support_matrix"])
        except Exception as exc:
            out["support_axes_error"] = f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE]
    if request.get("guard"):
        try:
            out["probes"] = (run_vllm_probes if request.get("builder") == "vllm" else run_probes)(request)
        except Exception:
            out["probes_error"] = traceback.format_exc(limit=5)[-MAX_MESSAGE:]
    return out


def main() -> int:
    request = json.load(sys.stdin)
    out = {name: run_job(job) for name, job in request["jobs"].items()}
    with open(request["out"], "w", encoding="utf-8") as answer:
        json.dump(out, answer)
    sys.stdout.flush()
    sys.stderr.flush()
    # The answer is written. Leave at once: threads the code under review started (vLLM's) can hold interpreter
    # shutdown for tens of seconds, which would count against the probes' time limit.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
