#!/usr/bin/env bash
# The GPU checks for a lent machine, in one short run (see ../shared/REFERENCE.md, "The lent
# GPU machine"): Python 3.12 with torch + CUDA + Triton there, no package registry.
#
#   device run: bash bench/device/device_check.sh        (carry .whl if wheels are needed)
#
# Wheels a check needs (py3.12, e.g. zfpy, pytest) go in .whl/ here (ignored by git; how to
# fetch them: /work/.library/device/README.md) and are installed to /tmp/site. Results are
# printed and copied under $OUT. Other helpers: append your checks as numbered sections,
# each short; the whole script must stay under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
status=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"

echo "== 1. codecs on CUDA: bytes and values equal the CPU reference (fused Triton kernels);"
echo "   the side stream's event ordering"
timeout 300 python3 -m pytest -q -p no:cacheprovider --basetemp=/tmp/pt-device \
  tests/unit/test_fixed_payloads.py tests/unit/test_compressors.py \
  tests/unit/test_side_stream.py -k "cuda or side_stream" 2>&1 \
  | tee "$OUT/codec_tests.txt" || status=1

echo "== 2. codec throughput as a ratio to a device-to-device copy (64 MiB fp32)"
timeout 180 python3 bench/device/device_codecs.py --mib 64 --repeats 10 2>&1 \
  | tee "$OUT/codec_speed.txt" || status=1

echo "== 3. compressed collectives on one NCCL rank, strict-device mode (every op, fixed and"
echo "   data-dependent codecs; a CPU tensor anywhere in the path fails); phases by CUDA events;"
echo "   then a compressed all-reduce on the side stream beside matmuls vs both on one stream"
timeout 180 python3 bench/device/device_check_collectives.py 2>&1 \
  | tee "$OUT/collectives.txt" || status=1

exit $status
