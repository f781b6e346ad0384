"""Pure comparisons behind bench/omb_compare.py and bench/omb_compressed.py.

Native vs Python: per-size medians over interleaved rounds, the overhead Python adds
(python - native, us) and the ratio, and a verdict against an overhead goal. Compressed vs
plain: the crossover size from which compression pays, and the link bandwidth below which
it would pay given the compressor's measured throughput.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Times = dict[int, float]  # message size (bytes) -> microseconds


def latencies(rows: Iterable[Mapping]) -> Times:
    """{size: average us} from parse_table rows ("Size", "Avg Latency(us)") or JSON rows."""
    out: Times = {}
    for row in rows:
        if "Size" in row:
            out[int(row["Size"])] = float(row["Avg Latency(us)"])
        else:
            out[int(row["size"])] = float(row["avg_us"])
    return out


def medians(rounds: list[Times]) -> Times:
    """Median per size over the rounds, for the sizes every round measured."""
    if not rounds:
        raise ValueError("no rounds to take medians of; run at least one round")
    sizes = set(rounds[0]).intersection(*rounds[1:])
    return {s: statistics.median(r[s] for r in rounds) for s in sorted(sizes)}


def overhead_range(ref: list[Times], other: list[Times]) -> dict[int, tuple[float, float]]:
    """{size: (lowest, highest)} of other - ref over the rounds, paired round by round.

    Both sides of a round ran back to back, so pairing them within the round keeps the
    machine's drifting load out of the difference as far as it can be kept out; the range
    says how far single rounds strayed from the median overhead.
    """
    if len(ref) != len(other) or not ref:
        raise ValueError(f"{len(ref)} reference rounds and {len(other)} other rounds: "
                         "pass the same (nonzero) number of rounds for both sides")
    sizes = set.intersection(*(set(r) for r in ref + other))
    out = {}
    for size in sorted(sizes):
        diffs = [o[size] - r[size] for r, o in zip(ref, other, strict=True)]
        out[size] = (min(diffs), max(diffs))
    return out


@dataclass(frozen=True)
class Pair:
    """One message size measured natively and from Python."""

    size: int
    native_us: float
    python_us: float

    @property
    def overhead_us(self) -> float:
        return self.python_us - self.native_us

    @property
    def ratio(self) -> float:
        return self.python_us / self.native_us if self.native_us > 0 else math.inf


def pair_up(native: Times, python: Times) -> list[Pair]:
    """Pairs for the sizes both sides measured, smallest first."""
    sizes = sorted(set(native) & set(python))
    if not sizes:
        raise ValueError(f"native sizes {sorted(native)} and python sizes {sorted(python)} "
                         "have none in common; run both over the same -m range")
    return [Pair(s, native[s], python[s]) for s in sizes]


def _range_cell(spread: Mapping[int, tuple[float, float]] | None, size: int) -> str:
    if spread is None:
        return ""
    lo, hi = spread.get(size, (math.nan, math.nan))
    return f"{f'{lo:+.2f}..{hi:+.2f}':>18}"


def _range_head(spread: Mapping | None) -> str:
    return "" if spread is None else f"{'overhead range':>18}"


def format_pairs(pairs: list[Pair], spread: Mapping[int, tuple[float, float]] | None = None
                 ) -> str:
    """spread: overhead_range's per-round lowest..highest overhead, as a last column."""
    head = (f"{'# Size':<10}{'native us':>12}{'python us':>12}{'overhead us':>13}{'ratio':>8}"
            + _range_head(spread))
    lines = [head]
    for p in pairs:
        lines.append(f"{p.size:<10}{p.native_us:>12.3f}{p.python_us:>12.3f}"
                     f"{p.overhead_us:>+13.3f}{p.ratio:>8.2f}{_range_cell(spread, p.size)}")
    return "\n".join(lines)


def format_sides(med: Mapping[str, Times], sides: tuple[str, ...],
                 spread: Mapping[int, tuple[float, float]] | None = None) -> str:
    """Sizes every side measured: each side's us, then the first side as the reference:
    the last side's overhead over it (us) and every other side's ratio to it; spread (the
    last side's per-round overhead range) as a last column."""
    ref, last = sides[0], sides[-1]
    sizes = sorted(set.intersection(*(set(med[s]) for s in sides)))
    head = f"{'# Size':<10}" + "".join(f"{s + ' us':>12}" for s in sides) \
        + f"{last + '-' + ref:>16}" + "".join(f"{s + '/' + ref:>14}" for s in sides[1:]) \
        + _range_head(spread)
    lines = [head]
    for size in sizes:
        base = med[ref][size]
        cells = "".join(f"{med[s][size]:>12.3f}" for s in sides)
        ratios = "".join(f"{med[s][size] / base if base > 0 else math.inf:>14.2f}"
                         for s in sides[1:])
        lines.append(f"{size:<10}{cells}{med[last][size] - base:>+16.3f}{ratios}"
                     f"{_range_cell(spread, size)}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    """Whether every size in [lo, hi] stays within limit_us of native; worst = largest gap."""

    name: str
    lo: int
    hi: int
    limit_us: float
    worst: Pair
    reference: str = "native"  # what the overhead is measured over (native, OSU C)

    @property
    def ok(self) -> bool:
        return self.worst.overhead_us <= self.limit_us

    def line(self) -> str:
        w = self.worst
        word = "PASS" if self.ok else "SHORT"
        rel = "<=" if self.ok else ">"
        return (f"{self.name} {self.lo}-{self.hi} B: {word}, worst overhead "
                f"{w.overhead_us:+.3f} us at {w.size} B ({w.python_us:.3f} vs "
                f"{w.native_us:.3f} us {self.reference}) {rel} {self.limit_us:.2f} us")


def verdict(name: str, pairs: list[Pair], lo: int, hi: int, limit_us: float,
            reference: str = "native") -> Verdict:
    inside = [p for p in pairs if lo <= p.size <= hi]
    if not inside:
        raise ValueError(f"{name}: no measured size in {lo}-{hi} B (have "
                         f"{[p.size for p in pairs]}); include that range in the run")
    return Verdict(name, lo, hi, limit_us, max(inside, key=lambda p: p.overhead_us),
                   reference)


def goal_line(verdicts: list[Verdict]) -> str:
    """One line for the whole goal: PASS only when every part passes."""
    word = "PASS" if all(v.ok for v in verdicts) else "SHORT"
    limit = max(v.limit_us for v in verdicts)
    parts = "; ".join(v.line() for v in verdicts)
    ref = verdicts[0].reference if verdicts else "native"
    return f"goal: Python overhead <= {limit:.2f} us over {ref}: {word} ({parts})"


def crossover(plain: Times, compressed: Times) -> int | None:
    """Smallest size from which compressed beats plain at that and every larger size."""
    sizes = sorted(set(plain) & set(compressed))
    best = None
    for s in reversed(sizes):
        if compressed[s] < plain[s]:
            best = s
        else:
            break
    return best


def break_even_GBps(ranks: int, ratio: float, encode_GBps: float,
                    decode_GBps: float) -> float | None:
    """Link bandwidth (GB/s per rank) below which the compressed allreduce would win.

    Plain ring allreduce: each rank receives 2(n-1)/n S bytes (time at bus bandwidth B).
    Compressed (encode, all-gather, decode all n, sum): (n-1) S/r bytes, plus S/E to encode
    and n S/D to decode. It wins when (n-1)(2/n - 1/r) S/B > S/E + n S/D; None when the
    all-gather moves no fewer bytes than the ring (r <= n/2), so it never wins.
    """
    saved = (ranks - 1) * (2 / ranks - 1 / ratio)
    if saved <= 0:
        return None
    return saved / (1 / encode_GBps + ranks / decode_GBps)
