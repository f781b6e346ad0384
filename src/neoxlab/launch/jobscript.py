"""Render a scheduler's job script from its launch/ template, with every value made safe.

Templates hold no logic: `{{ name }}` placeholders only. Values reach the script in two
ways: shell lines (quoted with shlex.quote, so `$(...)`, backticks and `;` stay text) and
scheduler directives (#BSUB/#SBATCH lines, which the scheduler parses without a shell:
there a value must match a plain-token pattern, because a newline would start a command).
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from neoxlab.config import Config, ConfigError
from neoxlab.engines.builtin.preemption import stop_request_file
from neoxlab.files import REPO_ROOT
from neoxlab.launch.ranks import rank_command, rank_env
from neoxlab.run import rundir
from neoxlab.run.rankjob import RankProgram

TEMPLATE_DIR = Path(__file__).with_name("templates")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
DIRECTIVE_VALUE = re.compile(r"^[A-Za-z0-9_.,:@%/+=-]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
JOB_NAME_MAX = 64


def sanitize_job_name(name: str) -> str:
    """Schedulers show job names in tables and paths: keep [A-Za-z0-9_.-], cap the length."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.-") or "neoxlab"
    return clean[:JOB_NAME_MAX]


def directive_value(field: str, value: object) -> str:
    """A value for a #BSUB/#SBATCH line; anything but a plain token is refused."""
    text = str(value)
    if not DIRECTIVE_VALUE.match(text):
        raise ConfigError(
            f"{field}={text!r} cannot go into a scheduler directive: only letters, digits and "
            "_ . , : @ % / + = - are allowed (no spaces, quotes, $, ; or newlines); "
            "use a plain value (for paths: a directory without spaces)"
        )
    return text


def quote(value: object) -> str:
    return shlex.quote(str(value))


def command_line(argv: list[str]) -> str:
    return " ".join(quote(a) for a in argv)


def setup_lines(cfg: Config) -> str:
    """Site set-up from the cluster config: module loads, an activate script, exports."""
    c = cfg.cluster
    lines = [f"module load {quote(m)}" for m in c.modules]
    if c.activate:
        lines.append(f"source {quote(c.activate)}")
    return "\n".join(lines) if lines else "# (no site set-up in the cluster config)"


def export_lines(cfg: Config, run_dir: Path) -> str:
    env = {**cfg.cluster.env, **rank_env(cfg, run_dir)}
    for name in env:
        if not ENV_NAME.match(name):
            raise ConfigError(
                f"cluster.env key {name!r} is not an environment variable name; "
                "use letters, digits and _ (not starting with a digit)"
            )
    return "\n".join(f"export {name}={quote(value)}" for name, value in env.items())


def python_of(cfg: Config) -> str:
    """The interpreter the compute nodes run: the cluster's setting or the one planning."""
    return cfg.cluster.python or sys.executable


def common_values(cfg: Config, run_dir: Path, program: RankProgram) -> dict[str, str]:
    """Placeholders every template shares; scheduler modules add their own."""
    python = python_of(cfg)
    return {
        "experiment": sanitize_job_name(cfg.experiment),
        "run_id": sanitize_job_name(run_dir.name),
        # experiment + the run's creation time: readable in bjobs/squeue, unique per run
        "job_name": sanitize_job_name(f"{cfg.experiment}.{run_dir.name.split('_')[0]}"),
        "nodes": str(cfg.cluster.nodes),
        "stdout": directive_value("launch.results_dir", run_dir.resolve() / "logs"),
        "setup": setup_lines(cfg),
        "exports": export_lines(cfg, run_dir),
        "repo_root": quote(REPO_ROOT),
        "python": quote(python),
        "run_dir": quote(run_dir.resolve()),
        "stop_file": quote(stop_request_file(run_dir.resolve())),
        "rank_command": command_line(rank_command(cfg, run_dir.resolve(), python, program)),
    }


def site_directives(prefix: str, options: list[tuple[str, object]]) -> str:
    """Optional directives (queue, account, extra); `option` may carry its own `=`."""
    lines = []
    for option, value in options:
        if not re.match(r"^-{1,2}[A-Za-z][A-Za-z0-9_-]*=?$", option):
            raise ConfigError(
                f"scheduler option {option!r} is not an option name; use e.g. "
                "cluster.extra={constraint: v100}"
            )
        sep = "" if option.endswith("=") else " "
        lines.append(f"{prefix} {option}{sep}{directive_value(option.strip('-='), value)}")
    return "\n".join(lines) if lines else "# (no site directives)"


def render(template: str, values: dict[str, str]) -> str:
    """Fill launch/<template>; a placeholder without a value is a bug, not a blank."""
    text = (TEMPLATE_DIR / template).read_text()
    missing = sorted({m for m in _PLACEHOLDER.findall(text) if m not in values})
    if missing:
        raise KeyError(f"launch/{template} needs values for {missing}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def write_script(run_dir: Path, name: str, text: str) -> Path:
    path = run_dir / name
    rundir.write_atomic(path, text)
    path.chmod(0o755)
    return path
