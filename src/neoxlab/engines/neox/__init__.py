"""engine=neox: a user's GPT-NeoX checkout run on ranks started by jsrun/srun (no deepy.py).

render   our config -> neox.yml (GPT-NeoX's argument names), written at planning
rules    engine=neox's rules (pure), and the pre-submit file checks
logs     GPT-NeoX's log lines read back (its metrics line and DeepSpeed's)
launch   each rank's command and environment for the job script
entry    `python -m neoxlab.engines.neox.entry <run_dir>`: the per-rank program
inject   the compression patch inside the GPT-NeoX process (also via patches/neoxlab_shim),
         after compat and (on a CPU cluster) cpu_mode
compat   GPT-NeoX adapted to our (upstream) DeepSpeed: eval_batch's return
cpu_mode GPT-NeoX on CPU ranks: torch.cuda patched at run time, AdamW for FusedAdam
data     the experiment's bytes as a GPT-NeoX prefix (.bin/.idx), cached
stop     stop requests inside GPT-NeoX's loop; the step a resume continues after
metrics  rank logs -> metrics.jsonl + summary.json after the job

The package imports nothing itself: the start-up shim imports neoxlab.engines.neox.inject in
every process of the job, which should not pay for the rest.
"""
