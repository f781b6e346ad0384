"""A builtin training run's data.path is checked before anything starts: a missing, empty,
unreadable or too small corpus is refused with exit 2, naming the path and the fix."""

from __future__ import annotations

import os
from pathlib import Path

from neoxlab.commands.cli import main
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.builtin.train_rules import validate_data


def refused(path: Path, results_dir: Path, capsys) -> str:
    code = main(["experiment=local_3d", "data=file", f"data.path={path}",
                 f"launch.results_dir={results_dir}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not any(results_dir.rglob("*")), "nothing may be planned or started"
    assert f"data.path={path}" in err
    return err


def test_missing_data_path_is_refused(tmp_path, results_dir, capsys):
    assert "does not exist" in refused(tmp_path / "nonexistent", results_dir, capsys)


def test_empty_data_file_is_refused(tmp_path, results_dir, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert "is empty" in refused(empty, results_dir, capsys)


def test_empty_data_folder_is_refused(tmp_path, results_dir, capsys):
    (tmp_path / "corpus").mkdir()
    assert "is empty" in refused(tmp_path / "corpus", results_dir, capsys)


def test_too_small_data_file_is_refused(tmp_path, results_dir, capsys):
    small = tmp_path / "small.txt"
    small.write_bytes(b"hello")
    err = refused(small, results_dir, capsys)
    need = 2 * compose_experiment("local_3d").model.seq_length + 1
    assert "gives 5 bytes" in err and f"({need})" in err


def test_unreadable_data_file_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"x" * 100_000)
    secret.chmod(0)
    cfg = compose_experiment("local_3d", ["data=file", f"data.path={secret}"])
    if os.geteuid() != 0:
        errors = validate_data(cfg)
    else:  # root reads any file: check in a forked child that gave up root
        for folder in (tmp_path, *tmp_path.parents):  # pytest's folders are 0o700
            if folder.stat().st_uid == 0 and not folder.stat().st_mode & 0o001:
                folder.chmod(folder.stat().st_mode | 0o011)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: drop to nobody, run the rule, report, leave at once
            try:
                os.setgid(65534)
                os.setuid(65534)
                os.write(write_end, "\n".join(validate_data(cfg)).encode())
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                os.write(write_end, f"child failed: {exc!r}".encode())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            errors = pipe.read().splitlines()
        os.waitpid(pid, 0)
    assert len(errors) == 1 and "cannot be read" in errors[0] and str(secret) in errors[0], errors


def test_a_usable_corpus_passes(tmp_path):
    text = tmp_path / "text.txt"
    text.write_bytes(b"abc " * 10_000)
    cfg = compose_experiment("local_3d", ["data=file", f"data.path={text}"])
    assert validate_data(cfg) == []
