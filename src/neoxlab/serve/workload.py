"""Request traces: N requests with constant or Poisson arrivals, reproducible by seed.

Prompt and output lengths are drawn independently of the arrival gaps, so the same seed at
a different mean gap gives the same requests arriving at scaled times (what a sweep needs).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

from neoxlab.run import rundir


@dataclass(frozen=True)
class Request:
    rid: int
    arrival_s: float  # offset from the start of the run
    prompt: list[int]
    max_new_tokens: int
    seed: int  # per-request sampling seed


@dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int
    arrival: str  # poisson | constant
    mean_gap_s: float
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    vocab_size: int
    seed: int


def make_workload(spec: WorkloadSpec) -> list[Request]:
    if spec.mean_gap_s < 0:
        raise ValueError(f"mean gap {spec.mean_gap_s} s is negative; use a gap >= 0")
    shape_rng = random.Random(spec.seed)
    gap_rng = random.Random(spec.seed + 1)
    requests, t = [], 0.0
    for rid in range(spec.num_requests):
        if rid > 0:
            if spec.arrival == "poisson" and spec.mean_gap_s > 0:
                t += gap_rng.expovariate(1.0 / spec.mean_gap_s)
            else:
                t += spec.mean_gap_s
        plen = shape_rng.randint(*spec.prompt_len)
        prompt = [shape_rng.randrange(spec.vocab_size) for _ in range(plen)]
        out = shape_rng.randint(*spec.output_len)
        requests.append(Request(rid, t, prompt, out, spec.seed * 1000 + rid))
    return requests


def trace_json(gap_ms: float, gap_scale: float, spec: WorkloadSpec,
               requests: list[Request]) -> dict:
    """One trace as saved in workload.json (nominal gap, scale, spec, every request)."""
    return {"gap_ms": gap_ms, "gap_scale": gap_scale, "spec": asdict(spec),
            "requests": [asdict(r) for r in requests]}


def load_traces(path: Path) -> list[tuple[float, list[Request]]]:
    """(nominal gap ms, requests) per trace of a run's workload.json."""
    data = rundir.read_json(path)
    return [(t["gap_ms"], [Request(**r) for r in t["requests"]]) for t in data["traces"]]
