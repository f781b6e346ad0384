#!/usr/bin/env bash
# The GPU checks for a lent machine, in one short run (see ../shared/REFERENCE.md, "The lent
# GPU machine"): Python 3.12 with torch + CUDA + Triton there, no package registry.
#
#   device run: bash bench/device/device_check.sh        (carry .whl if wheels are needed)
#   CPU dry run: DEVICE_CHECK_DRY=1 bash bench/device/device_check.sh   (every Python part on CPU,
#                small sizes; tests/integration/test_device_check_dry.py runs it in CI)
#
# Wheels a check needs (py3.12, e.g. zfpy, pytest) go in .whl/ here (ignored by git; how to
# fetch them: /work/.library/device/README.md) and are installed to /tmp/site. Results are
# printed and copied under $OUT. Exits non-zero when any check or speed goal fails. Each
# section runs under its own timeout; their sum stays under 480 s (a unit test adds them up).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1  # the repo root: this script lives in bench/device/
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
DRY=${DEVICE_CHECK_DRY:-0}
export PYTHONUNBUFFERED=1
PY=${DEVICE_CHECK_PYTHON:-python3}
if [[ "$DRY" == 1 ]]; then
  DEV=cpu MIB=1 FAIL_SHORT="" SPECS="fp16 int8 zfp:rate=8" SYNC_SPECS="fp16 mpc"
  export TRITON_INTERPRET=0
else
  DEV=cuda MIB=64 FAIL_SHORT=--fail-short SPECS="" SYNC_SPECS=""
  export TRITON_INTERPRET=0
fi
if compgen -G ".whl/*.whl" >/dev/null && [[ "$DRY" != 1 ]]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
status=0
if [[ "$DRY" == 1 ]]; then
  echo "dry run on CPU" | tee "$OUT/gpu.txt"
else
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
fi
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt" || status=1

echo "== 1. codecs on CUDA: bytes and values equal the CPU reference (fused Triton kernels);"
echo "   the side stream's event ordering"
timeout 120 "$PY" -m pytest -q -p no:cacheprovider --basetemp=/tmp/pt-device \
  tests/unit/test_fixed_payloads.py tests/unit/test_compressors.py \
  tests/unit/test_side_stream.py -k "cuda or side_stream" 2>&1 \
  | tee "$OUT/codec_tests.txt" || status=1

echo "== 2. codec throughput as a ratio to a device-to-device copy (speed goals enforced)"
# shellcheck disable=SC2086  # SPECS: one word per codec
timeout 90 "$PY" bench/device/device_codecs.py --device "$DEV" --mib "$MIB" --repeats 10 \
  $FAIL_SHORT ${SPECS:+--specs $SPECS} 2>&1 | tee "$OUT/codec_speed.txt" || status=1

echo "== 3. compressed collectives on one NCCL rank, strict-device mode (every op, fixed and"
echo "   data-dependent codecs; a CPU tensor anywhere in the path fails); phases by CUDA events;"
echo "   then a compressed all-reduce on the side stream beside matmuls vs both on one stream"
timeout 90 "$PY" bench/device/device_check_collectives.py --device "$DEV" 2>&1 \
  | tee "$OUT/collectives.txt" || status=1

echo "== 4. peak memory of every compressed op (error feedback on) against the estimate's bound"
timeout 60 "$PY" bench/device/op_memory.py --device "$DEV" --mib "$(( MIB > 1 ? 32 : 4 ))" \
  2>&1 | tee "$OUT/op_memory.txt" || status=1

echo "== 5. host syncs: none on the fixed-rate path, a few per segment for mpc/topk"
# shellcheck disable=SC2086  # SYNC_SPECS: one word per codec
timeout 90 "$PY" bench/device/sync_check.py --device "$DEV" --mib "$(( MIB > 1 ? 8 : 1 ))" \
  ${SYNC_SPECS:+--specs $SYNC_SPECS} 2>&1 | tee "$OUT/sync_check.txt" || status=1

echo "== device_check: $([[ $status == 0 ]] && echo OK || echo FAILED)"
exit $status
