"""gatekeeper: enforce a bounded-review policy on agent-assisted pull requests.

The core is pure: `evaluate(policy, changes, provenance, evidence) -> Verdict`. The CLI, the CI collector
and the GitHub App only build those inputs and render the verdict, so they cannot disagree.
"""

__version__ = "0.1.0"
