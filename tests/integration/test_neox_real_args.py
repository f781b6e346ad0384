"""Our neox.yml through a REAL GPT-NeoX checkout's argument classes.

Runs against the session's checkout (conftest `neox_dir`; NEOXLAB_TEST_NEOX_DIR points it
elsewhere, e.g. on the cluster's login node, in the environment the job uses). GPT-NeoX's
NeoXArgs.consume_neox_args decodes exactly the argv neoxlab's entry builds and runs its own
checks: unknown keys, exact value types, value rules and the derived batch size. No GPU is
needed for this part of GPT-NeoX.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.neox.entry import train_argv

NEOX_DIR = ""  # the session's checkout (conftest neox_dir: NEOXLAB_TEST_NEOX_DIR or vendored)


@pytest.fixture(autouse=True)
def _checkout(neox_dir) -> None:
    """Every test here runs against the checkout; without one they skip, saying why."""
    global NEOX_DIR
    NEOX_DIR = str(neox_dir)

PROBE = """
import json, sys
from megatron.neox_arguments import NeoXArgs
args = NeoXArgs.consume_neox_args(input_args=sys.argv[1:])
args.configure_distributed_args()
print("NEOXLAB_PROBE " + json.dumps({
    "train_batch_size": args.train_batch_size, "precision": args.precision,
    "zero_stage": args.zero_stage, "lr": args.lr, "world_size": args.world_size,
    "local_rank": args.local_rank, "is_pipe_parallel": args.is_pipe_parallel,
    "save": args.save, "load": args.load, "checkpoint_factor": args.checkpoint_factor,
    "deepspeed_config": args.deepspeed_config,
}))
"""
BASE = ["engine=neox", "data.path=/data/pile_text_document", "data.vocab_file=/data/tok.json"]


def _consume(tmp_path: Path, overrides: list[str]) -> dict:
    neox = Path(NEOX_DIR).resolve()
    cfg = compose_experiment("baseline_192gpu", [*BASE, f"cluster.neox_dir={neox}",
                                                 *overrides])
    run_dir = plan_run(cfg, check(cfg), [], tmp_path / "results")
    argv = train_argv(run_dir, neox)
    env = dict(os.environ, RANK="0", WORLD_SIZE="192", LOCAL_RANK="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(neox), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv[1:]], cwd=neox, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("NEOXLAB_PROBE ")]
    return json.loads(line.removeprefix("NEOXLAB_PROBE "))


@pytest.mark.timeout(400)
def test_gpt_neox_accepts_the_20b_config_and_derives_our_batch(tmp_path):
    seen = _consume(tmp_path, [])
    assert seen["train_batch_size"] == 4 * 32 * (192 // (2 * 8))
    assert seen["precision"] == "fp16" and seen["zero_stage"] == 1 and seen["lr"] == 0.97e-4
    assert seen["world_size"] == 192 and seen["local_rank"] == 0 and seen["is_pipe_parallel"]
    assert seen["save"] is None and seen["load"].endswith("/checkpoints")
    ds = seen["deepspeed_config"]
    assert ds["train_batch_size"] == 1536 and ds["zero_optimization"]["stage"] == 1
    assert ds["fp16"]["initial_scale_power"] == 12


@pytest.mark.timeout(400)
def test_gpt_neox_accepts_bf16_checkpoints_and_a_smaller_mlp(tmp_path):
    seen = _consume(tmp_path, ["train.precision=bf16", "train.checkpoint_every=10",
                               "model.ffn_mult=2", "+engine.neox_args.eval_iters=5"])
    assert seen["precision"] == "bfloat16"
    assert seen["save"] == seen["load"] and seen["checkpoint_factor"] == 10
