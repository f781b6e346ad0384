"""task=tune's stage (a) error budgets, computed from the loss-vs-rate map's committed data
file instead of numbers copied by hand, so a new map (studies/loss_rate_map.py writes the
same columns) changes the budgets and nothing else has to.

The rule (the map's, docs/tune.md step 4): a codec hurts on a dimension when its loss
deviated from the same-seed baseline more than naive's codec (`REFERENCE`, ZFP rate 8) did on
that dimension and precision; a dimension's budget is the largest proxy error of a codec
that did not hurt, below the smallest proxy error of any codec that did (the proxy orders
codecs of one kind as the loss does, not across kinds, so a harmless codec above a harmful
one does not raise it). The map has no pipeline traffic: PP takes TP's budget (an
assumption, stated in tune.budget_source).

Layer 0 (config/): the schema's default `tune.error_budget` is read from here.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from neoxlab.files import REPO_ROOT

MAP_FILE = REPO_ROOT / "docs" / "measurements" / "data" / "2026-12-04-loss-rate-map.rate_map.csv"
REFERENCE = "zfp:rate=8"  # naive's codec: the bar a codec's deviation is held to
COLUMNS = ("precision", "dim", "codec", "deviation", "proxy_error")
AS_TP = ("pp",)  # dimensions the map has no traffic for, given TP's budget


class BudgetMapError(ValueError):
    """A map file the budgets cannot be computed from (names the file and the fix)."""


def read_rows(path: Path) -> list[dict]:
    """The map's rows: precision, dim, codec, deviation, proxy_error (None when empty)."""
    try:
        with Path(path).open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise BudgetMapError(f"loss-vs-rate map {path} lacks columns {missing}; "
                                     "write it with studies/loss_rate_map.py")
            rows = list(reader)
    except OSError as exc:
        raise BudgetMapError(f"loss-vs-rate map {path} cannot be read ({exc}); restore it "
                             "from git or set every tune.error_budget.<dim> yourself") from None
    return [{**r, "deviation": float(r["deviation"]),
             "proxy_error": float(r["proxy_error"]) if r["proxy_error"] not in ("", None)
             else None} for r in rows]


def judge(rows: list[dict], reference: str = REFERENCE) -> None:
    """Mark each row: `naive_deviation` (the reference codec's on its dimension and
    precision) and `hurts` (a deviation above it). A dimension whose reference was not run
    has no bar to pass: its rows all hurt."""
    bar = {(r["precision"], r["dim"]): r["deviation"] for r in rows if r["codec"] == reference}
    for r in rows:
        r["naive_deviation"] = bar.get((r["precision"], r["dim"]))
        r["hurts"] = r["naive_deviation"] is None or r["deviation"] > r["naive_deviation"]


def budgets(rows: list[dict]) -> list[dict]:
    """Per dimension (rows judged): the largest proxy error of a harmless codec below the
    smallest proxy error of any codec that hurts; None when no harmless codec is below."""
    out = []
    for dim in dict.fromkeys(r["dim"] for r in rows):
        mine = [r for r in rows if r["dim"] == dim and r["proxy_error"] is not None]
        harmful = [r["proxy_error"] for r in mine if r["hurts"]]
        limit = min(harmful, default=math.inf)
        harmless = [r["proxy_error"] for r in mine if not r["hurts"] and r["proxy_error"] < limit]
        out.append({"dim": dim, "budget": max(harmless, default=None),
                    "smallest_harmful_proxy": None if not harmful else limit,
                    "codecs": len(mine)})
    return out


def error_budget(path: Path | None = None, reference: str = REFERENCE) -> dict[str, float]:
    """tune.error_budget's default: dimension -> budget, from the map at `path` (None: the
    committed map, MAP_FILE, looked up at each call)."""
    path = MAP_FILE if path is None else path
    rows = read_rows(path)
    judge(rows, reference)
    out = {b["dim"]: b["budget"] for b in budgets(rows) if b["budget"] is not None}
    if "tp" not in out:
        raise BudgetMapError(f"loss-vs-rate map {path} gives TP no budget (no harmless codec "
                             "below every harmful one); rerun studies/loss_rate_map.py or set "
                             "tune.error_budget.tp")
    for dim in AS_TP:
        out.setdefault(dim, out["tp"])
    return out
