"""`python -m neoxlab experiment=<name> [overrides]` (neoxlab.cli; `--list` names them).

A spare rank fork server starts first (run.forkserver.prestart): it imports the stack every
builtin rank program shares on the other core while this process imports, composes, checks
and plans, and the local launch then hands it its task instead of starting a server and
waiting for those imports (~3 s of an 8-rank start-up here). When nothing is launched here
(a job submitted, a config refused) it is stopped at exit.
"""

from __future__ import annotations

import sys

from neoxlab.run import forkserver

STACK = ("torch", "megatron.core")  # imported before any rank's task is known

if __name__ == "__main__":
    if sys.argv[1:] not in (["--list"], ["list"]):
        forkserver.prestart(STACK)
    from neoxlab.cli import main  # after the prestart, so the two imports overlap

    sys.exit(main())
