#!/usr/bin/env bash
# The GPU checks for a lent machine, in one short run (see ../shared/REFERENCE.md, "The lent
# GPU machine"): Python 3.12 with torch + CUDA + Triton there, no package registry.
#
#   device run: bash bench/device/device_check.sh        (carry .whl if wheels are needed)
#   CPU dry run: DEVICE_CHECK_DRY=1 bash bench/device/device_check.sh   (every Python part on CPU,
#                small sizes; tests/integration/test_device_check_dry.py runs it in CI)
#
# Wheels the checks need (the training step's DeepSpeed, megatron-core, hydra-core, omegaconf,
# their missing dependencies, and mpich for mpiexec) go in .whl/ here: build them with
# bench/device/build_wheels.sh (.whl/ is ignored by git) and carry .whl with the run. They
# are installed to /tmp/site. Results are printed and copied under $OUT. Exits non-zero when
# any check or speed goal fails. Each section runs under its own timeout; their sum stays
# under 480 s (tests/integration/test_device_check_dry.py adds them up).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1  # the repo root: this script lives in bench/device/
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
DRY=${DEVICE_CHECK_DRY:-0}
export PYTHONUNBUFFERED=1
PY=${DEVICE_CHECK_PYTHON:-python3}
if [[ "$DRY" == 1 ]]; then
  DEV=cpu MIB=1 FAIL_SHORT="" SPECS="fp16 int8 zfp:rate=8" SYNC_SPECS="fp16 mpc"
  NUMEL=4133  # values per rank in the multi-process exchange (not a multiple of a block)
  EXCHANGE_SPECS="none mpc zfp:rate=8"  # exact, data-dependent, lossy: each kind of check
  SLACK=5  # CPU runs on shared CI cores: each section may take this many times its limit
  export TRITON_INTERPRET=0
else
  DEV=cuda MIB=64 FAIL_SHORT=--fail-short SPECS="" SYNC_SPECS="" NUMEL=$(( (1 << 20) + 37 ))
  EXCHANGE_SPECS=""
  SLACK=1
  export TRITON_INTERPRET=0
fi
# limit SECONDS COMMAND...: a section's time limit on the GPU (their sum stays under 480 s);
# prints the time the section took, to rebalance the limits from a real run
limit() {
  local start=$SECONDS rc
  timeout "$(( $1 * SLACK ))" "${@:2}"
  rc=$?
  echo "   [took $(( SECONDS - start )) s of $(( $1 * SLACK )) s, exit $rc]"
  return $rc
}
if compgen -G ".whl/*.whl" >/dev/null && [[ "$DRY" != 1 ]]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH  # mpiexec and hydra_pmi_proxy
  # pip --target keeps the mpich wheel's programs (bin/) but drops its libraries: mpi4py
  # takes libmpi from the wheel itself
  for whl in .whl/mpich-*.whl; do
    [[ -e "$whl" ]] || continue
    "$PY" -m zipfile -e "$whl" /tmp/mpich || exit 1
    for lib in /tmp/mpich/mpich-*.data/data/lib/libmpi.so; do export MPI4PY_LIBMPI=$lib; done
  done
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
limit 75 "$PY" -m pytest -q -p no:cacheprovider --basetemp=/tmp/pt-device \
  tests/unit/test_fixed_payloads.py tests/unit/test_compressors.py \
  tests/unit/test_side_stream.py -k "cuda or side_stream" 2>&1 \
  | tee "$OUT/codec_tests.txt" || status=1

echo "== 2. codec throughput as a ratio to a device-to-device copy (speed goals enforced)"
# shellcheck disable=SC2086  # SPECS: one word per codec
limit 50 "$PY" bench/device/device_codecs.py --device "$DEV" --mib "$MIB" --repeats 10 \
  $FAIL_SHORT ${SPECS:+--specs $SPECS} 2>&1 | tee "$OUT/codec_speed.txt" || status=1

echo "== 3. compressed collectives on one NCCL rank, strict-device mode (every op, fixed and"
echo "   data-dependent codecs; a CPU tensor anywhere in the path fails); phases by CUDA events;"
echo "   then a compressed all-reduce on the side stream beside matmuls vs both on one stream"
limit 60 "$PY" bench/device/device_check_collectives.py --device "$DEV" 2>&1 \
  | tee "$OUT/collectives.txt" || status=1

echo "== 4. peak memory of every compressed op (error feedback on) against the estimate's bound"
limit 40 "$PY" bench/device/op_memory.py --device "$DEV" --mib "$(( MIB > 1 ? 32 : 4 ))" \
  2>&1 | tee "$OUT/op_memory.txt" || status=1

echo "== 5. host syncs: none on the fixed-rate path (counted, then forbidden: sync debug mode"
echo "   \"error\"), one a call for mpc/topk (two for the all-to-all all-reduce)"
# shellcheck disable=SC2086  # SYNC_SPECS: one word per codec
limit 50 "$PY" bench/device/sync_check.py --device "$DEV" --mib "$(( MIB > 1 ? 8 : 1 ))" \
  ${SYNC_SPECS:+--specs $SYNC_SPECS} 2>&1 | tee "$OUT/sync_check.txt" || status=1

echo "== 6. 4 processes on one GPU over gloo, through CompressionPatch, against uncompressed"
echo "   references: all-reduce (both algorithms), async callers, reduce, all-gather,"
echo "   send/recv, error feedback; fp16 and bf16; the fp16 loss scale and overflow"
# shellcheck disable=SC2086  # EXCHANGE_SPECS: one word per codec
limit 80 "$PY" bench/device/exchange_check.py --device "$DEV" --numel "$NUMEL" \
  --timeout $(( 70 * SLACK )) ${EXCHANGE_SPECS:+--specs $EXCHANGE_SPECS} 2>&1 \
  | tee "$OUT/exchange.txt" || status=1

echo "== 7. a real training run: python -m neoxlab, builtin engine, 2 ranks on the GPU,"
echo "   compression=naive, 2 steps: finite losses, compressed DP collectives in the records"
limit 90 "$PY" bench/device/train_step.py --device "$DEV" --timeout $(( 80 * SLACK )) 2>&1 \
  | tee "$OUT/runs.txt" || status=1

echo "== 8. serving on the GPU: weights, rotary tables and KV cache on the device, the CPU-only"
echo "   fast paths off, every policy token for token as on the CPU, in strict-device mode"
limit 25 "$PY" bench/device/serve_device.py --device "$DEV" 2>&1 \
  | tee -a "$OUT/runs.txt" || status=1

echo "== device_check: $([[ $status == 0 ]] && echo OK || echo FAILED)"
exit $status
