"""GPT-NeoX's log lines read back: its rank-0 metrics line and DeepSpeed's pipeline line, for
a run's own rank logs (metrics.collect_metrics) and for logs a user brings
(results.load); a broken line is counted, never fatal."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Malformed:
    """A line that looked like a metrics line but could not be read (kept for the report)."""

    source: str
    lineno: int
    reason: str
    line: str


@dataclass
class LogParse:
    """Both formats side by side: GPT-NeoX's rank-0 line and DeepSpeed's pipeline line."""

    neox: list[dict[str, Any]] = field(default_factory=list)
    deepspeed: list[dict[str, Any]] = field(default_factory=list)
    malformed: list[Malformed] = field(default_factory=list)


_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
_NEOX_FIELDS = {
    "samples_per_s": re.compile(r"^samples/sec:\s*" + _NUM + "$"),
    "iteration": re.compile(r"^iteration\s+(\d+)\s*/\s*(\d+)$"),
    "iteration_ms": re.compile(r"^elapsed time per iteration \(ms\):\s*" + _NUM + "$"),
    "lr": re.compile(r"^learning rate:\s*" + _NUM + "$"),
    "flops": re.compile(r"^approx flops per GPU:\s*" + _NUM + r"\s*([KMGTPE]?)FLOPS$"),
    "mfu_pct": re.compile(r"^MFU:\s*" + _NUM + "%$"),
    "hfu_pct": re.compile(r"^HFU:\s*" + _NUM + "%$"),
    "loss": re.compile(r"^lm_loss:\s*" + _NUM + "$"),
    "loss_scale": re.compile(r"^loss scale:\s*" + _NUM + "$"),
    "skipped_iterations": re.compile(r"^number of skipped iterations:\s*(\d+)$"),
    "nan_iterations": re.compile(r"^number of nan iterations:\s*(\d+)$"),
}
_NEOX_REQUIRED = ("samples_per_s", "iteration", "iteration_ms", "loss")
_FLOPS_SCALE = {"": 1e-12, "K": 1e-9, "M": 1e-6, "G": 1e-3, "T": 1.0, "P": 1e3, "E": 1e6}
_DS_LINE = re.compile(
    r"steps:\s*(\d+)\s+loss:\s*" + _NUM + r"\s+iter time \(s\):\s*" + _NUM
    + r"\s+samples/sec:\s*" + _NUM
)


def _neox_line(line: str) -> dict[str, Any]:
    """One rank-0 line -> a record; raises ValueError naming what is missing or unreadable."""
    start = line.find("samples/sec:")
    found: dict[str, re.Match[str]] = {}
    for part in line[start:].split("|"):
        part = part.strip()
        for key, pattern in _NEOX_FIELDS.items():
            match = pattern.match(part)
            if match:
                found[key] = match
                break
    missing = [key for key in _NEOX_REQUIRED if key not in found]
    if missing:
        raise ValueError(f"missing or unreadable: {', '.join(missing)}")
    step, total = found["iteration"].groups()
    record: dict[str, Any] = {
        "step": int(step),
        "total_steps": int(total),
        "iteration_s": float(found["iteration_ms"].group(1)) / 1000.0,
        "samples_per_s": float(found["samples_per_s"].group(1)),
    }
    for key in ("lr", "loss", "loss_scale"):
        record[key] = float(found[key].group(1)) if key in found else None
    for key in ("skipped_iterations", "nan_iterations"):
        record[key] = int(found[key].group(1)) if key in found else None
    if "flops" in found:
        value, prefix = found["flops"].groups()
        record["tflops_per_gpu"] = float(value) * _FLOPS_SCALE[prefix]
    else:
        record["tflops_per_gpu"] = None
    for key, out in (("mfu_pct", "mfu"), ("hfu_pct", "hfu")):
        record[out] = float(found[key].group(1)) / 100.0 if key in found else None
    return record


def parse_neox_log(text: str, source: str = "<log>") -> LogParse:
    """Read both metrics line formats; a broken metrics line is counted, never fatal."""
    out = LogParse()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if "samples/sec:" in line and "elapsed time per iteration" in line:
            try:
                out.neox.append(_neox_line(line))
            except ValueError as err:
                out.malformed.append(Malformed(source, lineno, str(err), line.strip()))
        elif "iter time (s):" in line:
            match = _DS_LINE.search(line)
            if match is None:
                out.malformed.append(
                    Malformed(source, lineno, "not 'steps: N loss: X iter time (s): Y "
                              "samples/sec: Z'", line.strip())
                )
                continue
            step, loss, iter_s, sps = match.groups()
            out.deepspeed.append({
                "step": int(step), "loss": float(loss), "iteration_s": float(iter_s),
                "samples_per_s": float(sps),
            })
    return out


def _rank_of(path: Path) -> int:
    match = re.fullmatch(r"rank(\d+)\.log", path.name)
    return int(match.group(1)) if match else -1  # a log given alone (stdout) comes first


def _last_per_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A resumed job repeats steps after its checkpoint: keep each step's latest line."""
    by_step = {r["step"]: r for r in records}
    return [by_step[s] for s in sorted(by_step)]


def neox_steps(logs: list[Path]) -> tuple[list[dict], list[Malformed], str]:
    """The one GPT-NeoX log reader: the steps of the lowest rank that logged GPT-NeoX lines
    (rank 0 prints them; others would repeat them), else DeepSpeed's lines, each step's last
    line kept; every malformed line of every log; the source (neox_log | deepspeed_log |
    none)."""
    bad: list[Malformed] = []
    fallback: list[dict] = []
    for path in sorted((p for p in logs if p.exists()), key=_rank_of):
        parsed = parse_neox_log(path.read_text(errors="replace"), str(path))
        bad += parsed.malformed
        if parsed.neox:
            return _last_per_step(parsed.neox), bad, "neox_log"
        fallback = fallback or parsed.deepspeed
    if fallback:
        return _last_per_step(fallback), bad, "deepspeed_log"
    return [], bad, "none"
