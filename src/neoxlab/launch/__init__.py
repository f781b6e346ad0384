"""Launchers: local (mpiexec), lsf (bsub + jsrun), slurm (sbatch + srun)."""
