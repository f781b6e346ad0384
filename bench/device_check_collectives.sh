#!/usr/bin/env bash
# GPU check of the compressed collectives: one NCCL rank, strict-device mode, every op and
# codec family, codec/comm phases timed with CUDA events. Usage: bench/device_check_collectives.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PYTHONPATH=$PWD/src timeout 300 "$PY" bench/device_check_collectives.py
