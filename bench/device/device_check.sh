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
# any check or speed goal fails; outside the dry run, at once when no CUDA device is there.
# Everything runs under a time limit, the set-up and the cache warm-up included; the limits
# sum to less than 480 s (tests/integration/test_device_check_dry.py adds them up), and the
# run starts from empty Triton and torch-extension caches, the dry run too, so that CI sees
# the compiling a fresh GPU machine does.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1  # the repo root: this script lives in bench/device/
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
DRY=${DEVICE_CHECK_DRY:-0}
export PYTHONUNBUFFERED=1
PY=${DEVICE_CHECK_PYTHON:-python3}
RUN_START=$SECONDS
if [[ "$DRY" == 1 ]]; then
  DEV=cpu MIB=1 FAIL_SHORT="" SPECS="fp16 int8 zfp:rate=8" SYNC_SPECS="fp16 mpc"
  MEMORY_SPECS="none fp16 int8 zfp:rate=8 mpc topk"
  NUMEL=4133  # values per rank in the multi-process exchange (not a multiple of a block)
  EXCHANGE_SPECS="none mpc zfp:rate=8"  # exact, data-dependent, lossy: each kind of check
  SLACK=5  # CPU runs on shared CI cores: each section may take this many times its limit
else
  DEV=cuda MIB=64 FAIL_SHORT=--fail-short SPECS="" SYNC_SPECS="" NUMEL=$(( (1 << 20) + 37 ))
  MEMORY_SPECS="none fp16 int8 zfp:rate=8 mpc topk"
  EXCHANGE_SPECS=""
  SLACK=1
fi
export TRITON_INTERPRET=0
# empty caches, as on a fresh GPU machine: what compiles, compiles in section 0's limit
CACHES=$(mktemp -d /tmp/device-check-caches.XXXXXX)
export TRITON_CACHE_DIR=$CACHES/triton TORCH_EXTENSIONS_DIR=$CACHES/torch_extensions
trap 'rm -rf "$CACHES"' EXIT
# limit SECONDS COMMAND...: a section's time limit on the GPU (their sum stays under 480 s);
# prints the time the section took, to rebalance the limits from a real run
limit() {
  local start=$SECONDS rc
  timeout "$(( $1 * SLACK ))" "${@:2}"
  rc=$?
  echo "   [took $(( SECONDS - start )) s of $(( $1 * SLACK )) s, exit $rc]"
  return $rc
}
# a GPU run needs a GPU: fail at once, before anything is installed or compiled
if [[ "$DRY" != 1 ]]; then
  if ! limit 15 "$PY" -c "import sys, torch
sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 1)"; then
    echo "device_check: no CUDA device (torch.cuda.is_available() is false, or torch is" \
      "missing): this is the GPU acceptance run; run it on the lent GPU machine, or the CPU" \
      "dry run with DEVICE_CHECK_DRY=1" | tee "$OUT/gpu.txt"
    echo "== device_check: FAILED (no GPU)"
    exit 2
  fi
fi
echo "== 0. set-up: carried wheels installed; caches warmed once, in one process (Triton"
echo "   kernels, the native decode attention, the wheels' .pyc)"
if compgen -G ".whl/*.whl" >/dev/null && [[ "$DRY" != 1 ]]; then
  limit 30 bash bench/device/install_wheels.sh || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH  # mpiexec and hydra_pmi_proxy
  for lib in /tmp/mpich/mpich-*.data/data/lib/libmpi.so; do
    [[ -e "$lib" ]] && export MPI4PY_LIBMPI=$lib  # pip --target drops the wheel's libraries
  done
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
status=0
if [[ "$DRY" == 1 ]]; then
  echo "dry run on CPU" | tee "$OUT/gpu.txt"
else
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
fi
limit 85 "$PY" bench/device/warm_caches.py --device "$DEV" 2>&1 | tee -a "$OUT/gpu.txt" \
  || status=1

echo "== 1. codecs on CUDA: bytes and values equal the CPU reference (fused Triton kernels);"
echo "   the side stream's event ordering (outside the dry run a skipped CUDA test fails)"
limit 40 "$PY" -m pytest -q -rs -p no:cacheprovider --basetemp=/tmp/pt-device \
  tests/unit/test_fixed_payloads.py tests/unit/test_compressors.py \
  tests/unit/test_side_stream.py -k "cuda or side_stream" 2>&1 \
  | tee "$OUT/codec_tests.txt" || status=1
if [[ "$DRY" != 1 ]] && grep -q "skipped" "$OUT/codec_tests.txt"; then
  echo "   FAILED: CUDA tests skipped on a GPU run (see SKIPPED above)"
  status=1
fi

echo "== 2. codec throughput as a ratio to a device-to-device copy (speed goals enforced)"
# shellcheck disable=SC2086  # SPECS: one word per codec
limit 40 "$PY" bench/device/device_codecs.py --device "$DEV" --mib "$MIB" --repeats 10 \
  $FAIL_SHORT ${SPECS:+--specs $SPECS} 2>&1 | tee "$OUT/codec_speed.txt" || status=1

echo "== 3. compressed collectives on one NCCL rank, strict-device mode (every op, fixed and"
echo "   data-dependent codecs; a CPU tensor anywhere in the path fails); phases by CUDA events;"
echo "   dist.all_reduce through CompressionPatch on the side stream, async; a compressed"
echo "   all-reduce beside matmuls vs both on one stream, against the overlap goal"
limit 45 "$PY" bench/device/device_check_collectives.py --device "$DEV" 2>&1 \
  | tee "$OUT/collectives.txt" || status=1

echo "== 4. peak memory of every compressed op (error feedback on) against the estimate's bound,"
echo "   fixed-rate and data-dependent codecs (their own temporaries counted)"
# shellcheck disable=SC2086  # MEMORY_SPECS: one word per codec
limit 35 "$PY" bench/device/op_memory.py --device "$DEV" --mib "$(( MIB > 1 ? 32 : 4 ))" \
  --specs $MEMORY_SPECS 2>&1 | tee "$OUT/op_memory.txt" || status=1

echo "== 5. host syncs: none on the fixed-rate path (counted, then forbidden: sync debug mode"
echo "   \"error\"), one a call for mpc/topk (two for the all-to-all all-reduce)"
# shellcheck disable=SC2086  # SYNC_SPECS: one word per codec
limit 35 "$PY" bench/device/sync_check.py --device "$DEV" --mib "$(( MIB > 1 ? 8 : 1 ))" \
  ${SYNC_SPECS:+--specs $SYNC_SPECS} 2>&1 | tee "$OUT/sync_check.txt" || status=1

echo "== 6. 4 processes on one GPU over gloo, through CompressionPatch, against uncompressed"
echo "   references: all-reduce (both algorithms), async callers, reduce, all-gather,"
echo "   send/recv, error feedback; fp16 and bf16; the fp16 loss scale and overflow"
# shellcheck disable=SC2086  # EXCHANGE_SPECS: one word per codec
limit 60 "$PY" bench/device/exchange_check.py --device "$DEV" --numel "$NUMEL" \
  --timeout $(( 55 * SLACK )) ${EXCHANGE_SPECS:+--specs $EXCHANGE_SPECS} 2>&1 \
  | tee "$OUT/exchange.txt" || status=1

echo "== 7. a real training run: python -m neoxlab, builtin engine, 2 ranks on the GPU,"
echo "   compression=naive, 2 steps: finite losses, compressed DP collectives in the records"
limit 65 "$PY" bench/device/train_step.py --device "$DEV" --timeout $(( 58 * SLACK )) 2>&1 \
  | tee "$OUT/runs.txt" || status=1

echo "== 8. serving on the GPU: weights, rotary tables and KV cache on the device, the CPU-only"
echo "   fast paths off, every policy token for token as on the CPU, in strict-device mode"
limit 20 "$PY" bench/device/serve_device.py --device "$DEV" 2>&1 \
  | tee -a "$OUT/runs.txt" || status=1

echo "== device_check: $([[ $status == 0 ]] && echo OK || echo FAILED)" \
  "(the whole run, set-up included: $(( SECONDS - RUN_START )) s)"
exit $status
