"""task=tune: per parallel dimension, the compression the performance model says pays, kept
only where a loss guard lets it through (docs/tune.md).

candidates (what can be tried) -> insitu (the cluster's profile, measured where the ranks run)
-> choose (predicted step times, pruned by the model's error margin, combined into schemes)
-> proxy (stage a: codec error on tensors captured from the run's own collectives) -> probe
(stage b: short runs from a shared checkpoint against the same-seed baseline) -> guard (the
verdicts) -> report (the chosen scheme as a compression config, the table, the figure).
task.py runs them in that order.
"""
