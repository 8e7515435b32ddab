"""Reports of a Verdict: Markdown (check-run summary, PR comment), JSON (the versioned contract), terminal."""

from gatekeeper.report.json_report import render_json
from gatekeeper.report.markdown import render_markdown
from gatekeeper.report.terminal import render_terminal

__all__ = ["render_json", "render_markdown", "render_terminal"]
