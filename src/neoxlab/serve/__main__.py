"""`python -m neoxlab.serve <run_dir>`: the per-rank serve entry under mpiexec, jsrun or srun."""

import sys
from pathlib import Path

from neoxlab.serve.program import main

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m neoxlab.serve <run_dir>")
    sys.exit(main(Path(sys.argv[1])))
