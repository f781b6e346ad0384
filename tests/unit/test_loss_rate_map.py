"""The error budget the loss-vs-rate map gives task=tune (studies/loss_rate_map.budgets)."""

import importlib.util
from pathlib import Path

STUDY = Path(__file__).resolve().parents[2] / "studies" / "loss_rate_map.py"
spec = importlib.util.spec_from_file_location("loss_rate_map", STUDY)
loss_rate_map = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loss_rate_map)


def row(dim: str, codec: str, proxy: float | None, hurts: bool) -> dict:
    return {"dim": dim, "codec": codec, "proxy_error": proxy, "hurts": hurts}


def test_budget_is_the_largest_harmless_proxy_below_every_harmful_one():
    rows = [row("tp", "zfp:rate=8", 0.02, False), row("tp", "int4", 0.12, False),
            row("tp", "zfp:rate=4", 0.29, True), row("tp", "zfp:rate=2", 0.99, True),
            # a harmless codec above a harmful one does not raise the budget
            row("zero", "zfp:rate=8", 0.004, False), row("zero", "zfp:rate=4", 0.063, False),
            row("zero", "int4", 0.031, True),
            row("dp", "zfp:rate=2", 1.0, True), row("dp", "int4", None, False)]
    got = {b["dim"]: b for b in loss_rate_map.budgets(rows)}
    assert got["tp"]["budget"] == 0.12 and got["tp"]["smallest_harmful_proxy"] == 0.29
    assert got["zero"]["budget"] == 0.004 and got["zero"]["smallest_harmful_proxy"] == 0.031
    assert got["dp"]["budget"] is None  # nothing harmless with a proxy error
    assert got["dp"]["codecs"] == 1


def test_no_harmful_codec_leaves_the_largest_harmless_proxy():
    rows = [row("pp", "zfp:rate=8", 0.02, False), row("pp", "int4", 0.1, False)]
    (only,) = loss_rate_map.budgets(rows)
    assert only["budget"] == 0.1 and only["smallest_harmful_proxy"] is None
