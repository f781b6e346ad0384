"""Launchers: local (mpiexec), lsf (bsub + jsrun), slurm (sbatch + srun); the emulated
cluster's launcher lives with the rest of it in neoxlab.emulated."""
