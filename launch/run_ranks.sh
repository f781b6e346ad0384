#!/bin/bash
# Node-side: run the rank launcher (srun/jsrun ...) and pass the scheduler's pre-walltime
# warning on to it, so the ranks checkpoint and exit before the job is killed.
# Usage: run_ranks.sh <launcher> [args...]; exits with the launcher's exit code.
set -uo pipefail
"$@" &
ranks=$!
trap 'echo "[neoxlab] warning signal: asking the ranks to checkpoint and stop" >&2; kill -USR1 "$ranks" 2>/dev/null' USR1 TERM
# `wait` returns early (status > 128) when a trapped signal arrives: wait again until the
# launcher itself has ended, then return its status.
while true; do
  wait "$ranks"
  code=$?
  kill -0 "$ranks" 2>/dev/null || exit "$code"
done
