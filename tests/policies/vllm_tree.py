"""The installed vLLM 0.33 wheel's sources as a repository tree for the policy tests, and mutated copies of it.

Nothing is downloaded: without the wheel (the [vllm] extra) the tests skip, saying so. A copy is a tree of
symbolic links to the installed files (8000 files, made in a fraction of a second), with the mutated file a real
file: put first on sys.path, it is the vllm the probe process imports.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

VLLM_VERSION = "0.33"


def installed_vllm() -> tuple[Path | None, str]:
    """The directory of the installed vllm package, or None and why not."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None, "vllm is not installed (the [vllm] extra); the vLLM policy tests download nothing"
    package = Path(next(iter(spec.submodule_search_locations)))
    from importlib.metadata import version

    found = version("vllm")
    if not found.startswith(VLLM_VERSION):
        return None, f"vllm {found} is installed; policies/vllm.yaml describes vllm {VLLM_VERSION}"
    if not (package / "models" / "kimi_k3" / "nvidia" / "specialized_decode").is_dir():
        return None, f"the installed vllm at {package} has no specialized_decode packages (a build without sources?)"
    return package, ""


def mirror(package: Path, root: Path) -> Path:
    """`root/vllm`: every directory of `package` recreated, every file a link to the installed one."""
    for directory, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        target = root / "vllm" / Path(directory).relative_to(package)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            (target / name).symlink_to(Path(directory) / name)
    return root


def mutate_raises(root: Path, guard: str, which: str = "last") -> Path:
    """In the mirror at `root`, turn the guard function's last `raise` (which="last") or every one ("all") into
    `pass`: the file becomes a real, edited copy. Returns its path."""
    module, function = guard.split(":")
    stem = root / module.replace(".", "/")
    path = stem.with_suffix(".py") if stem.with_suffix(".py").exists() else stem / "__init__.py"
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    raises = [n for n in ast.walk(node) if isinstance(n, ast.Raise)]
    assert raises, f"{guard} has no raise to mutate"
    lines = text.splitlines(keepends=True)
    for raised in raises[-1:] if which == "last" else raises:
        indent = lines[raised.lineno - 1][: raised.col_offset]
        # Same number of lines, so every other line keeps its number.
        lines[raised.lineno - 1] = f"{indent}pass  # mutated: was a raise\n"
        for number in range(raised.lineno, raised.end_lineno):
            lines[number] = "\n"
    path.unlink()
    path.write_text("".join(lines), encoding="utf-8")
    return path
