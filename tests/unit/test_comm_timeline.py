"""The ranks' host-timed phases: kept per call, capped, written, and lined up across ranks."""

import json
import time

import pytest

from neoxlab.comm import accounting, timeline
from neoxlab.comm.accounting import Accountant
from neoxlab.comm.collectives import Cost, Timed
from neoxlab.comm.records import write_rank_rows
from neoxlab.comm.timeline import Span, codec_overlap

CPU = __import__("torch").device("cpu")


def test_a_timed_block_keeps_its_wall_clock_start_and_duration():
    """A block that sleeps 20 ms, bracketed by clocks of the test's own: the duration is at
    least the sleep and at most the bracket; the start lies inside the bracket."""
    cost = Cost()
    wall_before, before = time.time(), time.perf_counter()
    with Timed(cost, "compress_s", CPU):
        time.sleep(0.02)
    bracket, wall_after = time.perf_counter() - before, time.time()
    (phase, start, took), = cost.spans
    assert phase == "compress_s"
    assert 0.02 <= took <= bracket
    assert cost.compress_s == took
    # seconds since the epoch: comparable between processes
    assert wall_before <= start <= wall_after


def test_the_accountant_keeps_spans_up_to_its_cap(monkeypatch):
    monkeypatch.setattr(accounting, "TIMELINE_SPANS", 3)
    acc = Accountant()
    for i in range(2):
        acc.record("dp", "all_reduce", bytes_in=8, bytes_out=2, comm_s=0.1, group_size=2,
                   spans=[("compress_s", 10.0 + i, 0.1), ("comm_s", 10.1 + i, 0.5)])
    rows = acc.timeline_rows(rank=1)
    assert [(r["phase"], r["start"]) for r in rows] == [
        ("compress_s", 10.0), ("comm_s", 10.1), ("compress_s", 11.0)]
    assert all(r["rank"] == 1 and r["dim"] == "dp" for r in rows)


def test_written_timelines_load_back_as_spans(tmp_path):
    (tmp_path / "logs").mkdir()
    acc = Accountant()
    acc.record("zero", "all_gather_into_tensor", bytes_in=8, bytes_out=2, comm_s=0.2,
               group_size=2, spans=[("decompress_s", 5.0, 0.25)])
    write_rank_rows(tmp_path, 0, acc)
    assert timeline.load(tmp_path) == [Span(0, "zero", "decompress_s", 5.0, 5.25)]


def _spans(rank: int, *phases: tuple[str, float, float]) -> list[Span]:
    return [Span(rank, "dp", phase, a, b) for phase, a, b in phases]


def test_ranks_encoding_at_once_count_as_all_busy():
    # 4 ranks encode over the same second, then wait on the wire together
    spans = [s for r in range(4)
             for s in _spans(r, ("compress_s", 0.0, 1.0), ("comm_s", 1.0, 3.0))]
    (o,) = codec_overlap(spans, (0.0, 10.0))
    assert o.busy_ranks == pytest.approx(4.0)
    assert o.codec_ranks == pytest.approx(4.0)
    assert o.codec_s_per_rank == pytest.approx(1.0)


def test_ranks_encoding_in_turn_while_the_others_wait_on_the_wire():
    # rank r encodes in [r, r + 1] and waits on the wire the rest of [0, 4]
    spans = []
    for r in range(4):
        wire = [("comm_s", a, b) for a, b in ((0.0, r), (r + 1.0, 4.0)) if b > a]
        spans += _spans(r, ("compress_s", float(r), r + 1.0), *wire)
    (o,) = codec_overlap(spans, (0.0, 10.0))
    assert o.busy_ranks == pytest.approx(1.0)
    assert o.codec_ranks == pytest.approx(1.0)


def test_a_rank_computing_outside_any_collective_counts_as_busy():
    spans = _spans(0, ("decompress_s", 0.0, 2.0)) + _spans(1, ("comm_s", 0.0, 1.0))
    # rank 1 waits on the wire for the first half, then computes (no span): busy half the time
    (o,) = codec_overlap(spans, (0.0, 10.0))
    assert o.busy_ranks == pytest.approx(1.5)
    assert o.codec_ranks == pytest.approx(1.0)


def test_spans_outside_the_window_are_left_out(tmp_path):
    spans = _spans(0, ("compress_s", 0.0, 1.0), ("compress_s", 20.0, 21.5))
    (o,) = codec_overlap(spans, (10.0, 30.0))
    assert o.codec_s_per_rank == pytest.approx(1.5)
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "iteration_s": 2.0, "time": 10.0 + 2 * i}) + "\n"
        for i in range(1, 6)))
    assert timeline.step_window(tmp_path, 3) == (14.0, 20.0)
