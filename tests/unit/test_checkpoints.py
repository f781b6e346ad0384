"""Checkpoint discovery, choice and pruning; metrics truncation; attempts in status.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from neoxlab.commands.resume import check_resumable
from neoxlab.commands.resume import main as resume_main
from neoxlab.config import Config, ConfigError, to_dict
from neoxlab.engines.builtin import checkpoints
from neoxlab.engines.builtin.reporting import keep_metrics_up_to, metrics_up_to
from neoxlab.engines.builtin.train_rules import validate_checkpointing
from neoxlab.run import rundir

FIXTURE_RUN = (Path(__file__).parents[1] / "fixtures" / "runs" / "local_compare"
               / "20261201-120000_tp2-pp2-dp2_z1_none")


def make_checkpoint(run_dir: Path, step: int, commit: bool = True) -> Path:
    """A checkpoint dir with a few files of distinct sizes, committed or not."""
    path = checkpoints.root(run_dir) / checkpoints.tag(step)
    (path / "neoxlab").mkdir(parents=True)
    (path / "mp_rank_00_model_states.pt").write_bytes(b"m" * (100 + step))
    (path / "neoxlab" / "rank0.pt").write_bytes(b"r" * 40)
    if commit:
        checkpoints.write_marker(path, step, world_size=1)
    return path


def test_tag_names_round_trip_and_other_names_are_ignored():
    assert checkpoints.tag(12) == "step12"
    assert checkpoints.step_of("step12") == 12
    for name in ("latest", "step", "stepx", "step-1", "global_step3", "zero_to_fp32.py"):
        assert checkpoints.step_of(name) is None, name


def test_scan_orders_by_step_number_and_marks_what_is_unusable(tmp_path):
    for step in (2, 9, 10):
        make_checkpoint(tmp_path, step)
    make_checkpoint(tmp_path, 11, commit=False)
    truncated = make_checkpoint(tmp_path, 8)
    (truncated / "mp_rank_00_model_states.pt").write_bytes(b"m" * 50)
    missing = make_checkpoint(tmp_path, 7)
    (missing / "neoxlab" / "rank0.pt").unlink()
    (checkpoints.root(tmp_path) / "zero_to_fp32.py").write_text("# DeepSpeed's helper\n")

    found = checkpoints.scan(tmp_path)
    assert [c.step for c in found] == [11, 10, 9, 8, 7, 2]  # 10 after 9: numbers, not text
    problems = {c.step: c.problem for c in found}
    assert "no completion marker" in problems[11]
    assert "truncated" in problems[8] and "mp_rank_00_model_states.pt" in problems[8]
    assert "missing" in problems[7] and "neoxlab/rank0.pt" in problems[7]
    assert [c.step for c in checkpoints.usable(found)] == [10, 9, 2]
    assert [c.step for c in checkpoints.skipped_newer(found, 10)] == [11]
    assert str(found[0].path) in checkpoints.describe(found[0])


def test_marker_lists_every_file_but_itself_and_temp_files(tmp_path):
    path = make_checkpoint(tmp_path, 3, commit=False)
    (path / "neoxlab" / ".rank1.pt.123.tmp").write_bytes(b"partial")
    checkpoints.write_marker(path, 3, world_size=8)
    meta = json.loads((path / checkpoints.MARKER).read_text())
    assert meta["step"] == 3 and meta["world_size"] == 8
    assert meta["files"] == {"mp_rank_00_model_states.pt": 103, "neoxlab/rank0.pt": 40}


def test_marker_of_another_step_or_unreadable_makes_it_unusable(tmp_path):
    path = make_checkpoint(tmp_path, 4)
    shutil.copy(path / checkpoints.MARKER, tmp_path / "marker")
    (path / checkpoints.MARKER).write_text("{not json")
    assert "unreadable" in checkpoints.check(path, 4)
    marker = json.loads((tmp_path / "marker").read_text())
    marker["step"] = 5
    (path / checkpoints.MARKER).write_text(json.dumps(marker))
    assert "step 5" in checkpoints.check(path, 4)


def test_prune_keeps_the_newest_usable_and_drops_older_leftovers(tmp_path):
    for step in (1, 2, 4, 5):
        make_checkpoint(tmp_path, step)
    make_checkpoint(tmp_path, 3, commit=False)  # a crashed write, older than the newest
    removed = checkpoints.prune(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["step1", "step2", "step3"]
    assert sorted(p.name for p in checkpoints.root(tmp_path).iterdir()) == ["step4", "step5"]


def test_prune_never_touches_anything_newer_than_the_newest_usable(tmp_path):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 6, commit=False)
    assert checkpoints.prune(tmp_path, keep=1) == []
    assert checkpoints.to_prune([], keep=1) == []


@pytest.mark.parametrize(
    ("train", "launch", "needle"),
    [
        ({"checkpoint_every": -1}, {}, "train.checkpoint_every=-1 is negative"),
        ({"keep_checkpoints": 0}, {}, "train.keep_checkpoints=0 must be >= 1"),
        ({"checkpoint_every": 2}, {"kill_during_checkpoint": 3}, "not a checkpoint step"),
        ({"checkpoint_every": 0}, {"kill_during_checkpoint": 2}, "not a checkpoint step"),
        ({"checkpoint_every": 2, "steps": 4}, {"kill_during_checkpoint": 6},
         "not a checkpoint step"),
        ({"checkpoint_every": 2}, {"kill_during_checkpoint": 2, "kill_rank": 8},
         "launch.kill_rank=8"),
        ({"steps": 6}, {"hold_step": 6}, "launch.hold_step=6 is not a step before the last"),
        ({"steps": 6}, {"hold_step": 0}, "launch.hold_step=0 is not a step before the last"),
    ],
)
def test_bad_checkpoint_settings_are_named(train, launch, needle):
    cfg = Config()
    for key, value in train.items():
        setattr(cfg.train, key, value)
    for key, value in launch.items():
        setattr(cfg.launch, key, value)
    errors = validate_checkpointing(cfg, world=8)
    assert len(errors) == 1 and needle in errors[0], errors


def test_good_checkpoint_settings_pass():
    cfg = Config()
    cfg.train.checkpoint_every, cfg.train.steps = 2, 6
    cfg.launch.kill_during_checkpoint, cfg.launch.kill_rank = 4, 7
    cfg.launch.hold_step = 5
    assert validate_checkpointing(cfg, world=8) == []


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def test_metrics_are_cut_back_to_the_checkpoint_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [json.dumps({"step": s, "loss": 10.0 - s}) for s in (1, 2, 3, 4, 5)]
    write_lines(path, [*records, json.dumps({"step": 2, "loss": 0.0}), '{"step": 6, "lo'])
    kept, dropped = metrics_up_to(path, 3)
    assert [(r["step"], r["loss"]) for r in kept] == [(1, 9.0), (2, 8.0), (3, 7.0)]
    assert dropped == 4  # steps 4 and 5, the repeated step 2 and the line cut short
    kept, _ = keep_metrics_up_to(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert keep_metrics_up_to(path, 0) == ([], 3) and path.read_text() == ""
    assert metrics_up_to(tmp_path / "absent.jsonl", 3) == ([], 0)


def test_attempts_record_start_end_exit_reason(tmp_path):
    rundir.set_status(tmp_path, "planned")
    rundir.begin_attempt(tmp_path)
    rundir.update_attempt(tmp_path, resumed_from=0)
    rundir.set_status(tmp_path, "failed", failed_rank=3, error="boom")
    rundir.end_attempt(tmp_path, 1, "rank 3: boom")
    rundir.end_attempt(tmp_path, 9, "late and ignored")  # already closed
    rundir.begin_attempt(tmp_path)  # the resumed attempt, then killed without a word
    status = rundir.begin_attempt(tmp_path)
    assert status["state"] == "running"
    assert "failed_rank" not in status and "error" not in status  # outcome of an old attempt
    first, second, third = status["attempts"]
    assert (first["exit"], first["reason"], first["resumed_from"]) == (1, "rank 3: boom", 0)
    assert first["start"] and first["end"]
    assert second["exit"] is None and second["reason"] == rundir.UNRECORDED_END
    assert third["end"] is None and third["exit"] is None
    rundir.end_attempt(tmp_path, 85, "preempted", overwrite=True)
    assert rundir.read_json(tmp_path / "status.json")["attempts"][-1]["exit"] == 85


def copy_fixture_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "results" / "local_compare" / FIXTURE_RUN.name
    shutil.copytree(FIXTURE_RUN, run_dir)
    return run_dir


def test_resume_refuses_a_completed_run_and_creates_nothing(tmp_path, capsys):
    run_dir = copy_fixture_run(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert resume_main([str(run_dir)]) == 2
    assert "already completed all 20 steps (20 in metrics.jsonl)" in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_resume_refuses_what_is_not_a_run_dir(tmp_path):
    with pytest.raises(ConfigError, match="is not a directory"):
        check_resumable(tmp_path / "absent")
    with pytest.raises(ConfigError, match=r"not a run dir \(no config.json or status.json\)"):
        check_resumable(tmp_path)
    assert resume_main([]) == 2 and resume_main(["a", "b"]) == 2


def test_resume_refuses_a_bad_checkpoint_setting_and_a_cluster_run_off_its_login_node(tmp_path):
    run_dir = copy_fixture_run(tmp_path)
    rundir.set_status(run_dir, "failed")
    config = json.loads((run_dir / "config.json").read_text())
    config["train"]["checkpoint_every"] = -2
    (run_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="train.checkpoint_every=-2 is negative"):
        check_resumable(run_dir)
    config["train"]["checkpoint_every"] = 2
    config["cluster"].update(scheduler="lsf", launcher="jsrun")
    (run_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="submits with bsub; not on this machine"):
        check_resumable(run_dir)


def test_resume_accepts_an_unfinished_local_run(tmp_path):
    run_dir = copy_fixture_run(tmp_path)
    rundir.set_status(run_dir, "failed")
    keep_metrics_up_to(run_dir / "metrics.jsonl", 7)
    cfg = check_resumable(run_dir)
    assert to_dict(cfg)["train"]["steps"] == 20
