"""Least-squares fits of the link model (pure arithmetic, so the emulated-cluster model and
the calibration task share them without importing the task)."""

from __future__ import annotations

import numpy as np

from neoxlab.config.profile import LinkProfile

BANDWIDTH_BENCHMARKS = ("allreduce", "allgather")  # fit alpha and B; "latency" fits p2p alpha


def steps_and_bytes(benchmark: str, n: int, size: float) -> tuple[float, float]:
    """The model's (message steps, bytes through the link) of one omb operation."""
    if benchmark == "allreduce":
        return 2 * (n - 1), 2 * (n - 1) / n * size
    if benchmark == "allgather":  # size: each rank's block (OSU's convention)
        return n - 1, (n - 1) * size
    return 1, size  # latency: one-way time of a ping-pong


def fit_alpha_beta(sweeps: list[tuple[str, int, list[dict], float]]) -> LinkProfile:
    """alpha and B by least squares over every row of the all-reduce and all-gather
    sweeps, t = steps alpha + bytes / B; the p2p alpha as the median over the latency rows
    of t - bytes / B. Times are divided by their sweep's stretch (runnable / on-core time) first."""
    a, b, p2p = [], [], []
    for benchmark, n, rows, k in sweeps:
        for row in rows:
            t = row["avg_us"] * 1e-6 / k
            steps, nbytes = steps_and_bytes(benchmark, n, row["size"])
            if benchmark in BANDWIDTH_BENCHMARKS:
                a.append([steps, nbytes])
                b.append(t)
            else:
                p2p.append((t, nbytes))
    alpha, inv_bw = nonnegative_lstsq(np.array(a), np.array(b))
    bandwidth = min(1.0 / inv_bw / 1e9 if inv_bw > 0 else float("inf"), 1e6)
    p2p_alpha = None
    if p2p:
        p2p_alpha = max(0.0, float(np.median([t - m / (bandwidth * 1e9) for t, m in p2p])))
        p2p_alpha *= 1e6
    return LinkProfile(latency_us=float(alpha) * 1e6, bandwidth_gbs=float(bandwidth),
                       p2p_latency_us=p2p_alpha)


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0: the best unconstrained fit over every subset of free
    parameters (the others at 0) whose solution is non-negative (a few parameters only)."""
    n = a.shape[1]
    best_err, best = np.inf, np.zeros(n)
    for mask in range(1, 2**n):
        cols = [i for i in range(n) if mask >> i & 1]
        sub = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if (sub < 0).any():
            continue
        x = np.zeros(n)
        x[cols] = sub
        err = float(np.sum((a @ x - b) ** 2))
        if err < best_err - 1e-15:
            best_err, best = err, x
    return best
