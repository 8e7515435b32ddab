"""Shared test configuration: GPU-marked tests skip on machines without a CUDA GPU, saying why; kernels compile for
the H200."""

from __future__ import annotations

import os

# The CuTe DSL target for every test that compiles kernels: the H200's sm_90a. The DSL reads CUTE_DSL_ARCH when
# cutlass is first imported and, without it and without a GPU, targets sm_100a. This conftest is loaded before any
# test module imports cutlass; until v15 the variable was set inside test_compile.py after cutlass had been imported,
# so CI's compile checks and SASS tests inspected sm_100a code (test_compile.py now checks the target).
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import secrets  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI explores the same examples on every run, so a landing never depends on luck; locally, every run explores anew
# (which is how the property tests found the trailer-parsing cases now pinned in tests/gatekeeper/test_provenance.py).
settings.register_profile("ci", derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


def _cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed (the [kernels] extra)"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine; GPU tests run on the H200 (see kimi_k3_path/evidence/)"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"GPU is sm_{major}{minor}; the specialized path is validated on sm_90 only"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = _cuda_reason()
    if reason is None:
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


# --- the Kimi K3 path's kernels and benchmarks: per-rank MoE shapes of the shipped config, seeds to replay ----------

@pytest.fixture
def dims():
    """dims(tp) -> the reference MoeDims of one rank at tensor-parallel size tp (the shipped Kimi K3 config)."""
    from kimi_k3_path.config import named_config, shard_shapes
    from kimi_k3_path.reference import MoeDims

    def moe_dims(tp: int):
        t = named_config("kimi_k3").text_config
        shards = shard_shapes(named_config("kimi_k3"), tp)
        return MoeDims(
            hidden=t.hidden_size, latent=t.routed_expert_hidden_size, experts=t.num_experts,
            top_k=t.num_experts_per_token, intermediate=shards.expert_intermediate,
            shared_intermediate=shards.shared_intermediate, routed_scaling_factor=t.routed_scaling_factor,
            eps=t.rms_norm_eps,
        )

    return moe_dims


@pytest.fixture
def seed(request) -> int:
    """A fresh random seed per test (printed, and recorded in JUnit), or KIMI_K3_TEST_SEED to replay one."""
    value = int(os.environ.get("KIMI_K3_TEST_SEED", secrets.randbits(31)))
    request.node.user_properties.append(("seed", value))
    print(f"seed {value} (replay with KIMI_K3_TEST_SEED={value})")
    return value


# --- a real headless Chromium for the details page (marker `browser`) -----------------------------------------------

CHROMIUM = os.environ.get("GATEKEEPER_CHROMIUM", "/usr/bin/chromium")  # Debian's `chromium` package
# Never a browser download (`playwright install`): Playwright drives the system's Chromium, offline.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (the [dev] extra)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)"
    return None


@pytest.fixture
def browser_page(tmp_path):
    """A page of a fresh headless Chromium (its own user-data-dir) and the console errors and page errors it saw.
    Skips, saying why, where Chromium or Playwright is missing, unless GATEKEEPER_REQUIRE_BROWSER is set (CI sets it:
    there a missing browser fails the run instead of skipping it)."""
    missing = _browser_missing()
    if missing is not None:
        if os.environ.get("GATEKEEPER_REQUIRE_BROWSER"):
            pytest.fail(f"browser tests are required here (GATEKEEPER_REQUIRE_BROWSER) but {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 900}, offline=False)
        try:
            page = context.new_page()
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
            page.on("requestfailed", lambda request: errors.append(f"request failed: {request.url}"))
            yield page, errors
        finally:
            context.close()


@pytest.fixture
def artifacts_dir():
    """Where the browser tests keep their screenshots: CI keeps this folder (git-ignored) as an artifact."""
    from pathlib import Path

    path = Path(os.environ.get("GATEKEEPER_ARTIFACTS", Path(__file__).parents[1] / "artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path
