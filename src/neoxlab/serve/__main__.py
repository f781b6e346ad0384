"""`python -m neoxlab.serve <run_dir>`: the per-rank serve entry under mpiexec, jsrun or srun."""

import sys
from pathlib import Path

from neoxlab.run.rankjob import exit_rank
from neoxlab.serve.program import main

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m neoxlab.serve <run_dir>")
    exit_rank(main(Path(sys.argv[1])))
