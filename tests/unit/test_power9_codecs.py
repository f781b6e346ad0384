"""A GPU cluster without Triton (Lassen's POWER9, cluster.arch=ppc64le) runs the codecs' NVRTC
kernels where its profile prices them (Lassen's does, assumed until measured), else their
torch-ops path: planning says which with the expected speed, and task=predict prices it."""

from __future__ import annotations

from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config.compose import compose_experiment
from neoxlab.perfmodel.predict import predict

NO_NVRTC = ["cluster.profile.codecs.zfp.nvrtc_encode_gbs=null",
            "cluster.profile.codecs.zfp.nvrtc_decode_gbs=null"]


def test_planning_on_lassen_says_the_codecs_run_their_nvrtc_kernels(tmp_path, capsys):
    cfg = compose_experiment("hybrid_192gpu", ["launch.submit=false"])
    plan_run(cfg, check(cfg), root=tmp_path)
    err = capsys.readouterr().err
    assert "cluster.arch=ppc64le" in err and "run their NVRTC kernels" in err
    assert "zfp ~50 GB/s encode against 100 GB/s fused" in err


def test_planning_without_nvrtc_warns_of_the_torch_codec_path(tmp_path, capsys):
    cfg = compose_experiment("hybrid_192gpu", ["launch.submit=false", *NO_NVRTC])
    plan_run(cfg, check(cfg), root=tmp_path)
    err = capsys.readouterr().err
    assert "torch-ops path" in err and "zfp ~4.5 GB/s encode against 100 GB/s fused" in err


def test_no_warning_where_triton_runs(tmp_path, capsys):
    cfg = compose_experiment("hybrid_192gpu", ["launch.submit=false", "cluster.arch=x86_64"])
    plan_run(cfg, check(cfg), root=tmp_path)
    err = capsys.readouterr().err
    assert "torch-ops path" not in err and "NVRTC" not in err


def test_lassen_predictions_price_the_nvrtc_path_marked_assumed():
    def run(*extra: str):
        return predict(compose_experiment("hybrid_192gpu", ["launch.submit=false", *extra]))

    nvrtc, torch_ops, triton = run(), run(*NO_NVRTC), run("cluster.arch=x86_64")
    codec = [p.breakdown["codec"] for p in (nvrtc, torch_ops, triton)]
    # 50 GB/s NVRTC against 4.5 GB/s torch ops and 100 GB/s fused (lassen.yaml)
    assert codec[1] > 3 * codec[0] > 3 * codec[2] > 0
    assert torch_ops.step_s > nvrtc.step_s > triton.step_s
    (note,) = [n for n in nvrtc.notes if n.startswith("zfp: no Triton")]
    assert "priced at its NVRTC kernels (50/50 GB/s" in note and "assumed:" in note
    assert any("torch-ops path" in n for n in torch_ops.notes)
    assert not any("no Triton" in n for n in triton.notes)
    baseline = {"cluster.arch=ppc64le": predict(compose_experiment("baseline_192gpu", [])),
                "cluster.arch=x86_64": predict(compose_experiment(
                    "baseline_192gpu", ["cluster.arch=x86_64"]))}
    first, second = baseline.values()
    assert first.step_s == second.step_s  # nothing compressed: nothing changes
