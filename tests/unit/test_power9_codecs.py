"""A GPU cluster without Triton (Lassen's POWER9, cluster.arch=ppc64le) runs the codecs'
torch-ops path: planning says so with the expected speed, and task=predict prices it."""

from __future__ import annotations

from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config.compose import compose_experiment
from neoxlab.perfmodel.predict import predict


def test_planning_on_lassen_warns_of_the_torch_codec_path(tmp_path, capsys):
    cfg = compose_experiment("hybrid_192gpu", ["launch.submit=false"])
    plan_run(cfg, check(cfg), root=tmp_path)
    err = capsys.readouterr().err
    assert "cluster.arch=ppc64le" in err and "torch-ops path" in err
    assert "zfp ~4.5 GB/s encode against 100 GB/s fused" in err


def test_no_warning_where_triton_runs(tmp_path, capsys):
    cfg = compose_experiment("hybrid_192gpu", ["launch.submit=false", "cluster.arch=x86_64"])
    plan_run(cfg, check(cfg), root=tmp_path)
    assert "torch-ops path" not in capsys.readouterr().err


def test_lassen_predictions_price_the_torch_codec_path():
    on_power9 = predict(compose_experiment("hybrid_192gpu", ["launch.submit=false"]))
    with_triton = predict(compose_experiment("hybrid_192gpu", ["launch.submit=false",
                                                               "cluster.arch=x86_64"]))
    codec = on_power9.breakdown["codec"], with_triton.breakdown["codec"]
    assert codec[0] > 3 * codec[1] > 0
    assert on_power9.step_s > with_triton.step_s
    assert any("torch-ops path" in note for note in on_power9.notes)
    baseline = {"cluster.arch=ppc64le": predict(compose_experiment("baseline_192gpu", [])),
                "cluster.arch=x86_64": predict(compose_experiment(
                    "baseline_192gpu", ["cluster.arch=x86_64"]))}
    first, second = baseline.values()
    assert first.step_s == second.step_s  # nothing compressed: nothing changes
