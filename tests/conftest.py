"""Session-wide test setup.

The CuTe DSL target for every test that compiles kernels is the H200's sm_90a. The DSL reads CUTE_DSL_ARCH when
cutlass is first imported, and without it (and without a GPU) it targets sm_100a. A root conftest is loaded before
any test module imports cutlass; until v15 the variable was set inside test_compile.py after cutlass had been
imported, so CI's compile checks and SASS tests inspected sm_100a code (tests/kimi_k3_path/kernels/test_compile.py
now checks the target)."""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
