"""Results: run dirs and GPT-NeoX logs -> tables (load, serve, tables), comparisons, figures."""

# The run context copied onto every row of the steps, comm and serve tables.
RUN_KEYS = ("experiment", "run_id", "status", "scheme", "model", "gpus", "tp")
