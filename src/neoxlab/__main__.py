"""`python -m neoxlab experiment=<name> [overrides]` (neoxlab.commands.cli; `--list` names
them, `--help` prints the usage) and `python -m neoxlab resume <run_dir>`
(neoxlab.commands.resume; what `make resume` runs).

A spare rank fork server starts first (forkserver.server.prestart): it imports the stack every
builtin rank program shares on the other core while this process imports, composes, checks
and plans, and the local launch then hands it its task instead of starting a server and
waiting for those imports. When nothing is launched here (a job submitted, a config or run
dir refused) it is stopped at exit.
"""

from __future__ import annotations

import sys

from neoxlab.forkserver import server as forkserver

STACK = ("torch", "megatron.core")  # imported before any rank's task is known


def prints_only(args: list[str]) -> bool:
    """--list, or -h/--help anywhere (cli.main): they print and exit, no rank is started."""
    return args in (["--list"], ["list"]) or any(arg in ("-h", "--help") for arg in args)


if __name__ == "__main__":
    args = sys.argv[1:]
    if not prints_only(args):
        forkserver.prestart(STACK)
    # imported after the prestart, so that their imports and the spare's overlap
    if args[:1] == ["resume"]:
        from neoxlab.commands.resume import main as resume

        sys.exit(resume(args[1:]))
    from neoxlab.commands.cli import main

    sys.exit(main(args))
