#!/usr/bin/env bash
# Build .whl/: the wheels a lent GPU machine (no network) lacks for experiments/benchmarks/gpu_benchmark.sh.
#
#   bash experiments/benchmarks/gpu_wheels.sh        # here, where PyPI is reachable (~1.5 MB); then carry .whl
#
# The GPU machine has Python 3.12 with jax (CUDA), flax, optax, chex, orbax, scikit-image, torch,
# torchvision, opencv and scikit-learn, but not Captum or pytorch-grad-cam (and its ttach). All
# three are pure Python; grad-cam publishes only a source archive, so its wheel is built here.
# jaxsal itself is not installed there: the benchmark imports the checkout in place.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
DEST=.whl
rm -rf "$DEST"   # only these wheels: every .whl/*.whl is installed there
mkdir -p "$DEST"
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  -d "$DEST" "captum==0.9.0" "ttach==0.0.3"
$PY -m pip wheel -q --no-deps -w "$DEST" "grad-cam==1.5.7"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
ls -l "$DEST"
