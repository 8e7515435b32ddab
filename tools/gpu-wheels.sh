#!/usr/bin/env bash
# Downloads, into .whl/ (git-ignored), the pure-Python dependencies the GPU machine lacks (it has torch but
# no pydantic and no internet). Carry ".whl" and ".cute" in a device run and start with `. tools/gpu-env.sh`.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  pydantic pydantic-core annotated-types typing-inspection typing-extensions pyyaml
# The CuTe DSL bundle (.cute/cute-*.tar.xz, ~54 MiB, git-ignored) comes from the workplace's own bundling script,
# whose path is not part of this repository: CUTE_BUNDLE_SCRIPT names it.
if ! ls .cute/*.tar.xz >/dev/null 2>&1; then
  : "${CUTE_BUNDLE_SCRIPT:?no .cute/cute-*.tar.xz: set CUTE_BUNDLE_SCRIPT to the script that makes it}"
  "$CUTE_BUNDLE_SCRIPT"
fi
