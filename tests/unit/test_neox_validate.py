"""engine=neox's validation: each rule names the value and the fix; files only at submit."""

from __future__ import annotations

import pytest

from neoxlab.commands.check import check, problems
from neoxlab.commands.cli import main
from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.neox.rules import check_neox_dir, check_neox_inputs

GOOD = [
    "engine=neox", "cluster.neox_dir=/gpfs/me/gpt-neox",
    "data.path=/gpfs/me/data/pile_text_document", "data.vocab_file=/gpfs/me/tok.json",
]


def _errors(*overrides: str, experiment: str = "baseline_192gpu") -> list[str]:
    return problems(compose_experiment(experiment, list(overrides)))


def test_a_complete_neox_experiment_is_valid():
    assert _errors(*GOOD) == []


def test_missing_neox_dir_names_the_fix():
    errors = _errors(*[o for o in GOOD if not o.startswith("cluster.neox_dir")])
    assert len(errors) == 1
    assert "cluster.neox_dir=/path/to/gpt-neox" in errors[0]


def test_neox_on_a_cpu_cluster_runs_in_cpu_mode_but_refuses_cuda_kernels(tmp_path):
    neox = tmp_path / "gpt-neox"
    (neox / "megatron" / "neox_arguments").mkdir(parents=True)
    (neox / "train.py").write_text("")
    cpu = ["engine=neox", f"cluster.neox_dir={neox}"]
    assert _errors(*cpu, "model.vocab_size=512", experiment="local_3d") == []  # our prefix
    vocab = _errors(*cpu, experiment="local_3d")  # local_3d's byte vocabulary is 256
    assert any("model.vocab_size=256" in e and "set model.vocab_size=512" in e for e in vocab)
    fused = _errors(*cpu, "model.vocab_size=512", "+engine.neox_args.rope_fusion=true",
                    experiment="local_3d")
    assert any("rope_fusion=true asks for a CUDA kernel" in e and "device 'cpu'" in e
               for e in fused)
    missing = _errors("engine=neox", f"cluster.neox_dir={tmp_path}/none", "model.vocab_size=512",
                      experiment="local_3d")
    assert any("does not exist on this machine" in e and "make neox-checkout" in e
               for e in missing)


def test_neox_runs_training_only():
    errors = _errors(*GOOD, "task=serve")
    assert any("task.name must be 'train'" in e and "'serve'" in e for e in errors)


def test_neox_needs_a_preprocessed_prefix_and_a_tokenizer():
    raw = _errors(*GOOD, "data.path=/gpfs/me/pile.txt")
    assert any("data.path='/gpfs/me/pile.txt'" in e and "prefix" in e for e in raw)
    no_vocab = _errors(*GOOD, "data.vocab_file=null")
    assert any("data.vocab_file=<file>" in e for e in no_vocab)
    bpe = _errors(*GOOD, "data.tokenizer_type=GPT2BPETokenizer")
    assert any("data.merge_file" in e for e in bpe)
    assert _errors(*GOOD, "data.tokenizer_type=CharLevelTokenizer", "data.vocab_file=null") == []
    wrong = _errors(*GOOD, "data.tokenizer_type=Bpe")
    assert any("data.tokenizer_type='Bpe'" in e for e in wrong)


def test_neox_args_must_be_real_and_not_owned():
    errors = _errors(*GOOD, "+engine.neox_args.num_layers=2", "+engine.neox_args.eval_itrs=5",
                     "+engine.neox_args.eval_iters=5")
    assert any("engine.neox_args.num_layers" in e and "model.num_layers" in e for e in errors)
    assert any("engine.neox_args.eval_itrs" in e and "not a GPT-NeoX argument" in e
               for e in errors)
    assert not any("eval_iters:" in e or ".eval_iters " in e for e in errors)
    assert len(errors) == 2


def test_zero_2_is_refused_because_gpt_neox_always_pipelines():
    errors = _errors(*GOOD, "zero.stage=2", "parallel.pp=1", "cluster.nodes=6")
    assert any("zero.stage=2 with engine=neox" in e for e in errors)


def test_builtin_experiments_are_untouched():
    """The neox rules run only for engine=neox: a builtin experiment passes every rule."""
    from neoxlab.commands.check import problems

    assert problems(compose_experiment("local_3d")) == []


def test_check_raises_with_every_neox_problem():
    cfg = compose_experiment("baseline_192gpu", ["engine=neox", "task=serve"])
    with pytest.raises(ConfigError) as err:
        check(cfg)
    assert "cluster.neox_dir" in str(err.value) and "task.name" in str(err.value)


def test_the_cli_refuses_before_planning(results_dir, capsys):
    code = main(["experiment=baseline_192gpu", "engine=neox", "launch.submit=false",
                 f"launch.results_dir={results_dir}"])
    assert code == 2
    assert "cluster.neox_dir=/path/to/gpt-neox" in capsys.readouterr().err
    assert not any(results_dir.rglob("*.json"))


def test_check_neox_dir(tmp_path):
    assert "not set" in check_neox_dir(None)
    assert "does not exist" in check_neox_dir(str(tmp_path / "nope"))
    (tmp_path / "train.py").write_text("")
    assert "megatron/neox_arguments" in check_neox_dir(str(tmp_path))
    (tmp_path / "megatron" / "neox_arguments").mkdir(parents=True)
    assert check_neox_dir(str(tmp_path)) is None


def test_check_neox_inputs_looks_for_the_files(tmp_path):
    neox = tmp_path / "gpt-neox"
    (neox / "megatron" / "neox_arguments").mkdir(parents=True)
    (neox / "train.py").write_text("")
    prefix = tmp_path / "data" / "pile_text_document"
    prefix.parent.mkdir()
    prefix.with_suffix(".bin").write_bytes(b"")
    cfg = compose_experiment("baseline_192gpu", [
        "engine=neox", f"cluster.neox_dir={neox}", f"data.path={prefix}",
        f"data.vocab_file={tmp_path / 'tok.json'}"])
    errors = check_neox_inputs(cfg)
    assert len(errors) == 2
    assert any(str(prefix) + ".idx" in e and ".bin" not in e.split("has no")[1] for e in errors)
    assert any("data.vocab_file=" in e for e in errors)
    prefix.with_suffix(".idx").write_bytes(b"")
    (tmp_path / "tok.json").write_text("{}")
    assert check_neox_inputs(cfg) == []
