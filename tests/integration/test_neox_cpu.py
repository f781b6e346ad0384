"""GPT-NeoX's REAL train.py on CPU ranks (engine=neox, CPU mode), from the vendored checkout
(tests/integration/neox_checkout.py; skips, saying why, without it or the `[neox]` extra).

Two launches, shared by every assertion of this module:
- `local_neox_compare` as a user starts it: GPT-NeoX on 8 ranks (TP=2 x PP=2 x DP=2, ZeRO-1)
  four times (none, naive, zhybrid, mzhybrid), then the comparison table and figures; the
  same four runs are the 8-rank members of paper_grid_neox_cpu, whose paper figures
  (`make figures`) are drawn from their logs;
- `local_neox` with evaluation and checkpoints, held after step 2 until a stop.request,
  then `python -m neoxlab resume` to the end.
The compression tests fail if the patch misses any dimension of GPT-NeoX's own traffic.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from neoxlab.engines.builtin.preemption import stop_request_file
from neoxlab.engines.neox.data import read_prefix
from neoxlab.engines.neox.stop import resume_step
from neoxlab.run.rankjob import PREEMPTED_EXIT
from tests.conftest import REPO_ROOT
from tests.integration.harness import read_metrics, read_status, resume_run

STEPS = 4
MEMBERS = ("local_neox", "local_neox_naive", "local_neox_zhybrid", "local_neox_mzhybrid")
SCHEME_OF = dict(zip(MEMBERS, ("none", "naive", "zhybrid", "mzhybrid"), strict=True))
GRID = "paper_grid_neox_cpu"  # its 8-rank members are MEMBERS
DIMS = ("dp", "zero", "tp", "pp")
# What each scheme puts on each dimension (configs/compression/*.yaml) and the ratio it
# must reach on fp32 payloads: ZFP at rate r keeps r of 32 bits; MPC is lossless, its ratio
# depends on the data (about 1 on these tensors), so it only has to code them.
ZFP8, ZFP24 = ("zfp(rate=8)", 32 / 8), ("zfp(rate=24)", 32 / 24)
SCHEMES = {
    "local_neox_naive": {"dp": ZFP8, "zero": ZFP8, "tp": ZFP8, "pp": ZFP8},
    "local_neox_zhybrid": {"dp": ZFP8, "zero": ZFP24, "tp": ZFP24, "pp": ZFP24},
    "local_neox_mzhybrid": {"dp": ZFP8, "zero": ("mpc", None), "tp": ("mpc", None),
                            "pp": ("mpc", None)},
}
pytestmark = pytest.mark.timeout(1200)


def _neoxlab(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neoxlab", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace")[-3000:]
                   for p in sorted((run_dir / "logs").glob("rank*.log")))


@pytest.fixture(scope="module")
def compare(neox_dir, tmp_path_factory) -> dict[str, Path]:
    results = tmp_path_factory.mktemp("neox_compare") / "results"
    proc = _neoxlab(["experiment=local_neox_compare", f"cluster.neox_dir={neox_dir}",
                     f"train.steps={STEPS}", "logger.wandb=disabled",
                     f"launch.results_dir={results}"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {name: next((results / name).iterdir()) for name in MEMBERS}
    runs["results"] = results
    runs["output"] = proc.stdout + proc.stderr
    return runs


def test_gpt_neox_trains_on_8_cpu_ranks_and_every_run_dir_is_complete(compare):
    assert "GPT-NeoX runs in CPU mode" in compare["output"]
    for name in MEMBERS:
        run_dir = compare[name]
        assert read_status(run_dir)["state"] == "completed", _logs(run_dir)
        steps = read_metrics(run_dir)
        assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
        assert steps[-1]["loss"] < steps[0]["loss"] - 0.1, [r["loss"] for r in steps]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps_source"] == "neox_log" and summary["steps"] == STEPS
        assert set(summary["comm"]) >= set(DIMS)
        assert "distributed_backend: gloo" in (run_dir / "neox.yml").read_text()
        assert sorted(p.name for p in (run_dir / "logs").glob("rank*.log")) == sorted(
            f"rank{r}.log" for r in range(8))
    table = compare["results"] / "tables" / "local_neox_compare.summary.md"
    assert all(f"| {label} | 8 |" in table.read_text()
               for label in ("Baseline", "Naive ZFP", "ZHybrid", "MZHybrid"))
    assert list((compare["results"] / "figures").glob("local_neox_compare.comm.png"))


def test_the_data_is_our_prefix_read_by_gpt_neox(compare):
    run_dir = compare["local_neox"]
    prefix = next(line.split(": ", 1)[1] for line in (run_dir / "neox.yml").read_text()
                  .splitlines() if line.startswith("data_path:"))
    assert Path(prefix).parent == compare["results"] / "data_cache" / "neox"
    docs = read_prefix(Path(prefix))
    assert len(docs) > 1
    # GPT-NeoX read our index: its train/valid/test split ends at our document count
    log = (run_dir / "logs" / "rank0.log").read_text()
    ends = [int(line.split(", ")[1].split(")")[0]) for line in log.splitlines()
            if "document indices in [" in line]
    assert ends and max(ends) == len(docs), ends


# GPT-NeoX's rank-0 line, read here on its own (not by neoxlab's parser)
NEOX_LINE = re.compile(r"samples/sec: ([\d.]+) \| iteration +(\d+)/.*\| lm_loss: ([\d.E+-]+) \|")


def _logged(run_dir: Path) -> dict[int, tuple[float, float]]:
    """step -> (samples/sec, lm_loss) as GPT-NeoX printed them in rank 0's log."""
    found = (NEOX_LINE.search(line) for line in
             (run_dir / "logs" / "rank0.log").read_text(errors="replace").splitlines())
    return {int(m[2]): (float(m[1]), float(m[3])) for m in found if m}


def test_the_papers_figures_are_drawn_from_these_gpt_neox_logs(compare):
    """`make figures EXP=paper_grid_neox_cpu` on the 8-rank runs: the paper's figure code
    (analysis/paper_grid.py) draws GPT-NeoX's logged numbers, not predictions, and leaves
    Lassen's published gains out of a CPU grid."""
    results = compare["results"]
    proc = subprocess.run([sys.executable, "-m", "neoxlab.results.figures", "--exp", GRID,
                           "--results", str(results)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for ext in ("png", "pdf"):
        assert (results / "figures" / f"{GRID}.paper.{ext}").stat().st_size > 10_000
    points = pd.read_csv(results / "tables" / f"{GRID}.paper_points.csv").set_index("scheme")
    assert set(points["source"]) == {"neox_log"}, points  # no prediction, no published row
    assert sorted(points.index) == sorted(SCHEME_OF.values())
    assert set(points["gpus"]) == {8} and set(points["device"]) == {"cpu"}
    steps = pd.read_parquet(results / "tables" / f"{GRID}.steps.parquet")
    for member, scheme in SCHEME_OF.items():
        logged = _logged(compare[member])
        assert sorted(logged) == list(range(1, STEPS + 1)), member
        curve = steps[steps["run_id"] == compare[member].name].sort_values("step")
        assert list(curve["loss"]) == [logged[s][1] for s in sorted(logged)], member
        steady = [logged[s][0] for s in logged if s > 2]  # metrics_warmup_steps: 2
        assert points.loc[scheme, "samples_per_s"] == pytest.approx(
            statistics.median(steady), rel=1e-3), member
    base = points.loc["none", "samples_per_s"]
    assert points.loc["naive", "samples_gain_pct"] == pytest.approx(
        (points.loc["naive", "samples_per_s"] / base - 1) * 100)


def _by_dim(run_dir: Path) -> dict[str, dict]:
    """Per dimension: all bytes, and the rows with coded calls (all of a row's calls coded:
    `full`; some: `mixed`) with their bytes in and out and compressors."""
    out: dict[str, dict] = {}
    for line in (run_dir / "comm.jsonl").read_text().splitlines():
        row = json.loads(line)
        entry = out.setdefault(row["dim"], {"bytes_in": 0, "coded_calls": 0, "compressors": set(),
                                            "full": [0, 0], "mixed": [0, 0]})
        entry["bytes_in"] += row["bytes_in"]
        if row["compressed_calls"]:
            entry["coded_calls"] += row["compressed_calls"]
            entry["compressors"].add(row["compressor"].split("(dim")[0])
            kind = "full" if row["compressed_calls"] == row["calls"] else "mixed"
            entry[kind][0] += row["bytes_in"]
            entry[kind][1] += row["bytes_out"]
    return out


@pytest.mark.parametrize("member", sorted(SCHEMES))
def test_every_dimension_of_gpt_neox_is_compressed_at_the_schemes_ratio(compare, member):
    """DP, ZeRO and TP rows carry coded fp32 payloads: their ratio is the scheme's.
    PP rows mix what DeepSpeed's pipeline sends per micro-batch: the fp32 activation (or its
    gradient), GPT-NeoX's attention mask cast to fp16 (ZFP at rate r codes 16 bits into r:
    half the fp32 ratio, none at rate 24) and metadata under min_bytes (raw); so there the
    ratio lies above 1 and at most the fp32 one."""
    dims = _by_dim(compare[member])
    for dim, (compressor, ratio) in SCHEMES[member].items():
        seen = dims.get(dim)
        assert seen and seen["coded_calls"] > 0, f"{member}: no compressed {dim} traffic"
        assert seen["compressors"] == {compressor}, (member, dim, seen["compressors"])
        coded_in = seen["full"][0] + seen["mixed"][0]
        assert coded_in > 0.9 * seen["bytes_in"], (member, dim, seen)  # small ones go raw
        if ratio is None:  # lossless MPC: whatever the data allows, never much larger
            got = coded_in / (seen["full"][1] + seen["mixed"][1])
            assert got > 0.95, (member, dim, got)
        elif dim == "pp":
            got = seen["mixed"][0] / seen["mixed"][1]
            assert 1.05 < got <= ratio * 1.01, (member, dim, got)
        else:  # rows whose calls were all coded, else (ZeRO: a small raw gather beside
            # each coded one) the mixed ones, whose few raw bytes stay within the tolerance
            coded = seen["full"] if seen["full"][1] else seen["mixed"]
            got = coded[0] / coded[1]
            assert got == pytest.approx(ratio, rel=0.05), (member, dim, got)


def test_scheme_none_codes_nothing_and_reaches_the_same_dimensions(compare):
    dims = _by_dim(compare["local_neox"])
    assert all(dims[d]["bytes_in"] > 0 and dims[d]["coded_calls"] == 0 for d in DIMS)


@pytest.fixture(scope="module")
def stopped_and_resumed(neox_dir, tmp_path_factory):
    """local_neox with evaluation every 2 steps and checkpoints every 3, held after step 2
    until a stop.request (written when rank 0 logged step 2), then resumed to STEPS + 2."""
    results = tmp_path_factory.mktemp("neox_stop") / "results"
    steps = STEPS + 2
    args = ["experiment=local_neox", f"cluster.neox_dir={neox_dir}", f"train.steps={steps}",
            "train.checkpoint_every=3", "launch.hold_step=2", "+engine.neox_args.eval_iters=1",
            "+engine.neox_args.eval_interval=2", "logger.wandb=disabled",
            f"launch.results_dir={results}"]
    launcher = subprocess.Popen([sys.executable, "-m", "neoxlab", *args], cwd=REPO_ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 400
        log = None
        while time.monotonic() < deadline and launcher.poll() is None:
            logs = list(results.glob("local_neox/*/logs/rank0.log"))
            log = logs[0] if logs else None
            if log and "iteration        2/" in log.read_text(errors="replace"):
                stop_request_file(log.parent.parent).touch()
                break
            time.sleep(1)
        out, _ = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    run_dir = next(results.glob("local_neox/*"))
    first = read_status(run_dir)
    saved = resume_step(run_dir)  # GPT-NeoX's own `latest`, before the resume adds more
    resumed = resume_run(run_dir, timeout=400)
    return {"run_dir": run_dir, "first": first, "first_code": launcher.returncode,
            "first_out": out, "saved": saved, "resumed": resumed, "steps": steps}


def test_evaluation_runs_with_our_deepspeeds_eval_batch(stopped_and_resumed):
    run_dir = stopped_and_resumed["run_dir"]
    log = (run_dir / "logs" / "rank0.log").read_text()
    # GPT-NeoX's evaluation unpacks (loss, metrics) from eval_batch: it crashed here before
    assert "validation results at iteration 2" in log, _logs(run_dir)
    assert "lm_loss value" in log


def test_a_stop_request_checkpoints_and_resume_continues_at_the_next_step(stopped_and_resumed):
    s = stopped_and_resumed
    run_dir, first = s["run_dir"], s["first"]
    assert s["first_code"] == PREEMPTED_EXIT, s["first_out"][-3000:] + _logs(run_dir)
    assert first["state"] == "preempted" and first["preempted_step"] == 2, first
    assert s["saved"] == 2  # checkpoints/latest named global_step2, which existed
    resumed = s["resumed"]
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "from the checkpoint after step 2" in resumed.stdout
    status = read_status(run_dir)
    assert status["state"] == "completed"
    assert [a["exit"] for a in status["attempts"]] == [PREEMPTED_EXIT, 0]
    steps = read_metrics(run_dir)
    assert [r["step"] for r in steps] == list(range(1, s["steps"] + 1))
    log = (run_dir / "logs" / "rank0.log").read_text()  # both attempts, appended
    trained = [int(line.split("iteration", 1)[1].split("/")[0])
               for line in log.splitlines() if "elapsed time per iteration" in line]
    assert trained == list(range(1, s["steps"] + 1)), trained  # every step once: from 3 on
    assert resume_step(run_dir) == s["steps"]  # GPT-NeoX saved at its end, too
