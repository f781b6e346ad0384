"""Stop requests inside GPT-NeoX's own training loop, and where a resume would continue.

The builtin engine checks for a stop at every step boundary (engines/builtin/preemption.py:
SIGUSR1/SIGTERM, or run_dir/stop.request written by a job script at the time-limit warning).
GPT-NeoX has no such hook, but at the end of every iteration each rank asks
`megatron.training.is_save_iter(neox_args, iteration)` (when `save` is set, i.e. with
train.checkpoint_every > 0). `StopHook` wraps that function right after GPT-NeoX's module is
imported: the ranks agree on a stop (one MPI all-reduce, as the builtin engine), answer
"save now" and set `neox_args.exit_interval` to this iteration, so GPT-NeoX saves its own
checkpoint and leaves through its own exit path (after a barrier); the entry then ends the
attempt as preempted. `launch.hold_step` holds the ranks after that step until a stop comes,
as for the builtin engine (a test aid). A resumed attempt loads GPT-NeoX's newest checkpoint
(neox.yml's `load`) and continues at the next step.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from neoxlab.engines.builtin.preemption import StopSignals, signal_name, stop_request_file
from neoxlab.engines.neox.render import CHECKPOINT_DIR

TRAINING_MODULE = "megatron.training"
HOLD_POLL_S = 0.5
_TAG = re.compile(r"^global_step(\d+)$")


def resume_step(run_dir: Path) -> int | None:
    """The step of the checkpoint GPT-NeoX would load from run_dir (DeepSpeed's `latest`
    file names its tag, global_step<N>), or None when there is none."""
    latest = Path(run_dir) / CHECKPOINT_DIR / "latest"
    if not latest.is_file():
        return None
    match = _TAG.match(latest.read_text().strip())
    if match is None or not (latest.parent / match.group(0)).is_dir():
        return None
    return int(match.group(1))


class StopHook:
    """Installed by the entry before train.py runs; `stopped_at` is the step it stopped
    after (None: it did not stop)."""

    def __init__(self, run_dir: Path, hold_step: int | None) -> None:
        self.signals = StopSignals(stop_request_file(run_dir))
        self.hold_step = hold_step
        self.first_iteration: int | None = None
        self.stopped_at: int | None = None
        self.signum = 0

    def install(self) -> StopHook:
        # deferred: the shim's module (inject), only once a hook is installed
        from neoxlab.engines.neox.inject import after_import

        self.signals.install()
        after_import(TRAINING_MODULE, self._wrap)
        return self

    def uninstall(self) -> None:
        self.signals.uninstall()

    def signal_name(self) -> str:
        return signal_name(self.signum)

    def _wrap(self) -> None:
        training = sys.modules[TRAINING_MODULE]
        original = training.is_save_iter

        def is_save_iter(neox_args, iteration: int) -> bool:
            if self.first_iteration is None:
                self.first_iteration = iteration
            if self._stop_now(iteration, neox_args.train_iters):
                neox_args.exit_interval = iteration  # GPT-NeoX exits right after saving
                print(f"[neoxlab] {self.signal_name()}: checkpoint after step {iteration}, "
                      "then stop", flush=True)
                return True
            return original(neox_args, iteration)

        training.is_save_iter = is_save_iter

    def _stop_now(self, iteration: int, last: int) -> bool:
        if iteration >= last:
            return False  # the last step: finishing is stopping
        signum = self.signals.agreed()
        fresh = self.first_iteration == 1  # testing aid only in an attempt from step 0
        while fresh and iteration == self.hold_step and not signum:
            time.sleep(HOLD_POLL_S)
            signum = self.signals.agreed()
        if signum:
            self.signum, self.stopped_at = signum, iteration
        return bool(signum)
