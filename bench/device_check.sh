#!/usr/bin/env bash
# The acceptance run for a lent GPU: codecs on CUDA against the CPU reference, GB/s against a
# device copy, compressed collectives on NCCL, per-op memory, host syncs, a 4-process exchange
# on the GPU (fp32, fp16, bf16, loss scale), a 2-step training run. The script and its
# Python parts live in bench/device/; this entry keeps the documented command working.
#   device run:  bash bench/device_check.sh
#   CPU dry run: DEVICE_CHECK_DRY=1 bash bench/device_check.sh
exec bash "$(dirname "$0")/device/device_check.sh" "$@"
