"""`python -m neoxlab.engines.builtin <run_dir>`: the per-rank training entry under
mpiexec, jsrun or srun."""

import sys
from pathlib import Path

from neoxlab.engines.builtin.program import main

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m neoxlab.engines.builtin <run_dir>")
    sys.exit(main(Path(sys.argv[1])))
