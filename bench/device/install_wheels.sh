#!/usr/bin/env bash
# The carried wheels (.whl/, bench/device/build_wheels.sh) installed to /tmp/site for
# device_check.sh, inside its set-up time limit. pip --target keeps the mpich wheel's
# programs (bin/) but drops its libraries: the wheel is unzipped to /tmp/mpich, where
# device_check.sh points mpi4py at its libmpi.so.
set -euo pipefail
PY=${DEVICE_CHECK_PYTHON:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
for whl in .whl/mpich-*.whl; do
  [[ -e "$whl" ]] || continue
  "$PY" -m zipfile -e "$whl" /tmp/mpich
done
