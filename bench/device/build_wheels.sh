#!/usr/bin/env bash
# Wheels the device check's training step needs on the lent GPU machine, built here where the
# package registry answers (the machine has Python 3.12 + torch + CUDA + Triton, no registry).
# They go to .whl/ (ignored by git, never committed); bench/device/device_check.sh installs
# .whl/*.whl into /tmp/site there. Carry .whl with the run (about 25 MiB of the 64 MiB limit).
#
#   bash bench/device/build_wheels.sh            (PYTHON=... to pick the pip that runs)
#
# Pure-Python packages are built with `pip wheel --no-deps` (DeepSpeed from its sdist, no ops
# compiled: DS_BUILD_OPS=0; they build at first use on the GPU machine if ever needed).
# Packages with compiled parts are fetched as CPython 3.12 x86-64 wheels. Versions follow
# pyproject.toml; what the machine already has (numpy, packaging, PyYAML, psutil, py-cpuinfo,
# einops, msgpack, ninja, tqdm, typing-extensions, nvidia-ml-py) is not carried.
set -euo pipefail
cd "$(dirname "$0")/../.." || exit 1  # the repo root: this script lives in bench/device/
PY=${PYTHON:-python3}
DEST=.whl
PURE=(deepspeed==0.19.8 hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
      hjson==3.1.0 pydantic==2.14.4 annotated-types==0.8.0 typing-inspection==0.4.5)
# megatron-core ships compiled helpers; pydantic-core is Rust; mpich brings mpiexec and libmpi
# for mpi4py (the training launcher's rank discovery)
BINARY=(megatron-core==0.16.1 pydantic-core==2.50.5 mpich==5.0.2)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
           manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)

mkdir -p "$DEST"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-cache-dir -w "$DEST" "${PURE[@]}"
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platform_args[@]}" -d "$DEST" "${BINARY[@]}"

# one version of each package: two stop the whole install on the machine
dupes=$(find "$DEST" -name '*.whl' -printf '%f\n' | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort \
  | uniq -d)
if [[ -n "$dupes" ]]; then
  echo "build_wheels: more than one wheel of: $dupes; delete the older ones in $DEST" >&2
  exit 1
fi
for whl in "$DEST"/*.whl; do
  case "$whl" in
    *-py3-none-any.whl|*-py2.py3-none-any.whl|*-cp312-*x86_64*.whl|*-py3-none-manylinux*) ;;
    *) echo "build_wheels: $whl does not install on CPython 3.12 x86-64" >&2; exit 1 ;;
  esac
done
du -ch "$DEST"/*.whl
