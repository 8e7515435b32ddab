# Source this at the start of a device run (carry: [".cute", ".whl"]): unpacks the CuTe DSL bundle and the
# carried wheels into /tmp and puts the repository, the wheels and CuTe DSL on PYTHONPATH.
# Assumes of the machine: Linux x86_64, Python 3.12 with pip, torch (CUDA build) and Triton installed, xz and tar,
# a writable /tmp, no network (everything else comes in the carried .cute/ and .whl/), the repository root as cwd.
set -e
mkdir -p /tmp/cute /tmp/site
xz -dc .cute/cute-*.tar.xz | tar x -C /tmp/cute
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD:/tmp/site:/tmp/cute:/tmp/cute/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
set +e
