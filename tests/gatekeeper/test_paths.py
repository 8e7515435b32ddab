from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper.paths import matches, matches_any, path_problem


@pytest.mark.parametrize(
    "path",
    ["vllm/models/kimi_k3/nvidia/mla.py", "a", "README.md", "dir with space/f.txt", "tést/ünïcode.py", "a/.github/x",
     "a/..b/c", "a/b../c", "...", ".gitignore", "x/.gitmodules"],
)
def test_clean_paths_have_no_problem(path):
    assert path_problem(path) is None


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("", "empty path"),
        ("a/\x00b", "NUL"),
        ("../etc/passwd", "'..'"),
        ("vllm/models/kimi_k3/../../attention.py", "'..'"),
        ("a/..", "'..'"),
        ("/etc/passwd", "absolute"),
        ("C:/Windows/x", "drive letter"),
        ("c:x", "drive letter"),
        ("a\\b.py", "backslash"),
        ("a\\..\\b", "backslash"),
        ("a//b", "empty path segment"),
        ("a/", "empty path segment"),
        ("./a", "'.' segment"),
        ("a/./b", "'.' segment"),
        (".git/hooks/pre-commit", "'.git'"),
        ("sub/.GIT/config", "'.git'"),
        ("a\tb", "control character U+0009"),
        ("a\nb", "control character U+000A"),
        ("a\x7fb", "control character U+007F"),
        ("a\x85b", "control character U+0085"),
        ("kimi_k3/\u202eyp.exe", "bidirectional control character U+202E"),
        ("a\u2066b", "bidirectional control character U+2066"),
        ("a\u200fb", "bidirectional control character U+200F"),
        ("a\u200bb", "invisible formatting character U+200B"),
        ("a\ufeffb", "invisible formatting character U+FEFF"),
        ("a\udc80b", "lone surrogate"),
    ],
)
def test_hostile_paths_name_their_problem(path, expected):
    problem = path_problem(path)
    assert problem is not None and expected in problem


@pytest.mark.parametrize(
    ("path", "pattern"),
    [
        ("vllm/models/kimi_k3/nvidia/mla.py", "vllm/models/kimi_k3/**"),
        ("vllm/models/kimi_k3/x", "vllm/models/kimi_k3/**"),
        ("a/b", "a/**/b"),
        ("a/x/b", "a/**/b"),
        ("a/x/y/b", "a/**/b"),
        ("top.py", "**/*.py"),
        ("deep/er/top.py", "**/*.py"),
        ("benchmarks/kernels/benchmark_kimi_k3_moe.py", "benchmarks/kernels/benchmark_kimi_k3_*"),
        ("a1.txt", "a?.txt"),
        ("ab.py", "a[abc].py"),
        ("a-.py", "a[!abc].py"),
        ("ac.py", "a[a-c].py"),
        ("a]b", "a[]]b"),
        ("a*b", "a\\*b"),
        ("a[b", "a[b"),
        ("x.py", "x**.py"),
        ("exact/file.txt", "exact/file.txt"),
        ("a.b+c(d)", "a.b+c(d)"),
    ],
)
def test_glob_matches(path, pattern):
    assert matches(path, pattern)


@pytest.mark.parametrize(
    ("path", "pattern"),
    [
        ("vllm/models/kimi_k3", "vllm/models/kimi_k3/**"),  # the directory itself is not a file below it
        ("vllm/models/kimi_k3_evil/x.py", "vllm/models/kimi_k3/**"),
        ("vllm/models/kimi_k3x/x.py", "vllm/models/kimi_k3*/**/y"),
        ("sub/top.py", "*.py"),  # anchored, unlike gitignore
        ("a/x/b", "a/*"),
        ("a/x/bc", "a/**/b"),
        ("xa/b", "a/**/b"),
        ("a12.txt", "a?.txt"),
        ("a/b", "a?b"),
        ("a/b", "a[/]b"),
        ("a/b", "a[!x]b"),
        ("ad.py", "a[abc].py"),
        ("ab", "a\\*b"),
        ("axb", "a.b"),
        ("benchmarks/kernels/sub/benchmark_kimi_k3_moe.py", "benchmarks/kernels/benchmark_kimi_k3_*"),
    ],
)
def test_glob_does_not_match(path, pattern):
    assert not matches(path, pattern)


def test_matches_any_and_empty_pattern():
    assert matches_any("b/x", ["a/**", "b/**"])
    assert not matches_any("c/x", ["a/**", "b/**"])
    assert not matches_any("c/x", [])
    with pytest.raises(ValueError, match="empty glob"):
        matches("a", "")


_segment = st.text(alphabet="abc._-", min_size=1, max_size=4).filter(lambda s: s not in (".", ".."))


@settings(max_examples=60, deadline=None)
@given(st.lists(_segment, min_size=1, max_size=5), st.integers(min_value=0, max_value=4))
def test_double_star_below_a_prefix_matches_exactly_the_files_under_it(segments, cut):
    path = "/".join(segments)
    cut = min(cut, len(segments) - 1)
    prefix = "/".join(segments[:cut])
    pattern = f"{prefix}/**" if prefix else "**"
    assert matches(path, pattern)
    # A literal pattern matches only itself.
    assert matches(path, path.replace("[", "\\[").replace("*", "\\*").replace("?", "\\?"))
    assert not matches(path + "x", path)
