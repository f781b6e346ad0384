"""The plug points' registries (TASKS, ENGINES, SCHEDULERS): a name registered twice or a name
nobody registered is refused with the value and the known names, the records answer what
the commands used to ask by name, and no code outside the registries compares a name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from neoxlab.commands.cli import main
from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.registry import ENGINES
from neoxlab.files import REPO_ROOT
from neoxlab.launch.cluster_rules import validate_cluster
from neoxlab.launch.schedulers import SCHEDULERS, scheduler_of
from neoxlab.layout import resolve_layout
from neoxlab.results.tables import experiments_in
from neoxlab.run import rundir
from neoxlab.tasks import TASKS

SRC = Path(__file__).resolve().parents[2] / "src" / "neoxlab"
REGISTRIES = {SRC / "tasks" / "__init__.py", SRC / "engines" / "registry.py",
              SRC / "launch" / "schedulers.py", SRC / "registry.py"}


@pytest.mark.parametrize(("registry", "name"), [(TASKS, "train"), (ENGINES, "builtin"),
                                                (SCHEDULERS, "slurm")])
def test_a_name_registered_twice_is_refused_and_the_first_record_kept(registry, name):
    first = registry[name]
    with pytest.raises(ValueError, match=rf"'{name}' is registered twice \(known: \["):
        registry.register(name, first)
    assert registry[name] is first and list(registry).count(name) == 1


@pytest.mark.parametrize(("registry", "key"), [(TASKS, "task.name"), (ENGINES, "engine.name"),
                                               (SCHEDULERS, "cluster.scheduler")])
def test_an_unknown_name_is_refused_with_the_known_ones(registry, key):
    with pytest.raises(ConfigError) as err:
        registry["nope"]
    assert f"{key}='nope' is not one of {list(registry)}" in str(err.value)
    assert "nope" not in registry and registry.get("nope") is None


def test_an_unknown_scheduler_is_refused_before_planning(tmp_path, capsys):
    code = main(["experiment=local_dp", "cluster.scheduler=pbs",
                 f"launch.results_dir={tmp_path}"])
    assert code == 2
    assert ("cluster.scheduler='pbs' is not one of ['local', 'emulated', 'lsf', 'slurm']"
            in capsys.readouterr().err)
    assert not any(tmp_path.rglob("*"))


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO_ROOT / "configs/cluster")
                                        .glob("*.yaml")))
def test_every_cluster_config_names_a_scheduler_record(name):
    cfg = compose_experiment("local_dp", [f"cluster={name}", "launch.submit=false"])
    record = scheduler_of(cfg)
    assert cfg.cluster.launcher in record.launchers
    # a record either runs the job here or hands a script to a queue, never both or neither
    assert record.runs_here != (record.write_script is not None and record.submit is not None)


def test_emulated_links_go_with_the_scheduler_that_builds_them():
    local = compose_experiment("emulated_2x2", ["cluster.scheduler=local",
                                                "cluster.launcher=mpiexec",
                                                "launch.submit=false"])
    assert any("does not build them; use cluster.scheduler=emulated" in e
               for e in validate_cluster(local))
    bare = compose_experiment("local_dp", ["cluster.scheduler=emulated", "launch.submit=false"])
    assert any("has no cluster.emulated links" in e for e in validate_cluster(bare))


def test_a_task_folder_of_run_dirs_is_not_taken_for_an_experiment(tmp_path):
    cfg = compose_experiment("local_dp", [])
    layout = resolve_layout(cfg)
    rundir.freeze(cfg, layout, [], root=tmp_path)  # results/<exp>/<run_id>/
    folders = [t.output_dir for t in TASKS.values() if t.output_dir]
    assert folders, "predict and tune write their own folders"
    for folder in folders:
        rundir.freeze(cfg, layout, [], root=tmp_path / folder)  # results/<folder>/<exp>/<run>/
    assert experiments_in(tmp_path) == ["local_dp"]


# what the commands asked before the records held it; a registry may compare its own names
NAME_COMPARISONS = re.compile(r"scheduler == |task\.name ==|\.task == |task\.name != ")


def test_no_code_outside_the_registries_compares_a_registered_name():
    found = [f"{path.relative_to(SRC)}:{n}: {line.strip()}"
             for path in sorted(SRC.rglob("*.py")) if path not in REGISTRIES
             for n, line in enumerate(path.read_text().splitlines(), start=1)
             if NAME_COMPARISONS.search(line)]
    assert found == []
