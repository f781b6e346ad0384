# Sourced by the neoxlab job scripts (bash), node-side.
# The scheduler's pre-walltime warning (Slurm --signal=B:USR1, LSF -wa URG) reaches this
# batch shell only; it asks the ranks to checkpoint and stop by creating a stop-request file
# in the run dir, which rank 0 checks at every step boundary. A signal sent to the ranks
# themselves would also kill whatever child a rank runs at that moment (a compiler, ninja).
# Usage: source src/neoxlab/launch/templates/stop_on_signal.sh <stop-request file>; run_ranks <launcher> [args...]
neoxlab_stop_file="$1"
trap 'echo "[neoxlab] time-limit warning: asking the ranks to checkpoint and stop" >&2; touch "$neoxlab_stop_file"' USR1 URG TERM

# Run the launcher in the background so the trap fires at once (bash defers traps while a
# foreground command runs); `wait` returns early on a trapped signal, so wait again until the
# launcher has ended; return its exit status.
run_ranks() {
  "$@" &
  local pid=$! code
  while true; do
    wait "$pid"
    code=$?
    kill -0 "$pid" 2>/dev/null || return "$code"
  done
}
