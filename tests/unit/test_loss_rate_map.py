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


def test_a_codec_hurts_when_it_deviates_more_than_naives_codec_on_its_dimension():
    rows = [{"precision": "fp32", "dim": "dp", "codec": "zfp:rate=8", "deviation": 0.0005},
            # inside a seed spread of 0.057, yet 35x naive's deviation: the int4 pick's case
            {"precision": "fp32", "dim": "dp", "codec": "int4", "deviation": 0.0177},
            {"precision": "fp32", "dim": "tp", "codec": "int8", "deviation": 0.0001},
            {"precision": "bf16", "dim": "dp", "codec": "zfp:rate=4", "deviation": 0.0004}]
    loss_rate_map.judge(rows)
    hurts = {(r["precision"], r["dim"], r["codec"]): r["hurts"] for r in rows}
    assert hurts == {("fp32", "dp", "zfp:rate=8"): False, ("fp32", "dp", "int4"): True,
                     # no reference run on the dimension or precision: no bar to pass
                     ("fp32", "tp", "int8"): True, ("bf16", "dp", "zfp:rate=4"): True}
