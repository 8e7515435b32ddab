"""Reports of a Verdict: Markdown (check-run summary, PR comment), JSON (the versioned contract), terminal, and the
HTML details page.

The renderers load on first use: `gatekeeper check --format json` should not pay for jinja2 and rich.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {"render_json": "json_report", "render_markdown": "markdown", "render_terminal": "terminal",
            "render_html": "html"}
__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
