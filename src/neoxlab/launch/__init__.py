"""Launchers: local (mpiexec), emulated (network namespaces on this machine: emulated/), lsf
(bsub + jsrun), slurm (sbatch + srun); each a record in schedulers.py."""
