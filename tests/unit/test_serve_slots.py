"""Slot reordering keeps the live range contiguous under every finish order (property test),
and the serve workload is reproducible."""

from __future__ import annotations

import random

import pytest

from neoxlab.serve.slots import SlotTable, plan_reorder
from neoxlab.serve.workload import WorkloadSpec, make_workload


def _contiguous(table: SlotTable) -> bool:
    lo, hi = table.span()
    return hi - lo == len(table.live())


@pytest.mark.parametrize("seed", range(40))
def test_reordering_keeps_live_range_contiguous_under_random_finishes(seed):
    rng = random.Random(seed)
    slots = rng.randint(1, 12)
    table = SlotTable(slots, reorder=True)
    owners: dict[int, int] = {}  # request -> slot, updated by the moves
    next_id = 0
    for _ in range(200):
        if table.free() and (not owners or rng.random() < 0.5):
            owners[next_id] = table.assign(next_id)
            next_id += 1
        else:
            rid = rng.choice(sorted(owners))
            moves = table.release(owners.pop(rid))
            by_slot = {s: r for r, s in owners.items()}
            for src, dst in moves:
                assert table.owner[src] is None and dst not in by_slot
                owners[by_slot.pop(src)] = dst
                by_slot[dst] = table.owner[dst]
        assert _contiguous(table), table.owner
        assert {table.owner[s]: s for s in table.live()} == owners


def test_without_reordering_holes_stay_inside_the_range():
    table = SlotTable(4, reorder=False)
    for rid in range(4):
        table.assign(rid)
    assert table.release(1) == []
    assert table.span() == (0, 4) and not _contiguous(table)
    assert table.assign(9) == 1  # a new request refills the hole


def test_finishing_at_an_end_moves_nothing_and_inner_finish_moves_the_fewest():
    assert plan_reorder([0, 1, 2]) == []
    assert plan_reorder([3, 4, 5]) == []
    # window [2, 8) already holds 5 of the 6 live slots: one copy, 0 -> 2
    assert plan_reorder([0, 3, 4, 5, 6, 7]) == [(0, 2)]
    assert plan_reorder([0, 1, 2, 4]) == [(4, 3)]  # tie: the lowest window


def test_full_table_refuses_assignment():
    table = SlotTable(1, reorder=True)
    table.assign(0)
    with pytest.raises(RuntimeError, match="waiting"):
        table.assign(1)


def test_workload_is_reproducible_and_gap_only_scales_arrivals():
    spec = WorkloadSpec(20, "poisson", 0.02, (2, 5), (3, 9), 256, seed=5)
    a, b = make_workload(spec), make_workload(spec)
    assert a == b
    assert len({r.max_new_tokens for r in a}) > 1  # variable output lengths
    assert all(3 <= r.max_new_tokens <= 9 and 2 <= len(r.prompt) <= 5 for r in a)
    arrivals = [r.arrival_s for r in a]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    slower = make_workload(WorkloadSpec(20, "poisson", 0.2, (2, 5), (3, 9), 256, seed=5))
    assert [r.prompt for r in slower] == [r.prompt for r in a]
    assert slower[-1].arrival_s == pytest.approx(10 * a[-1].arrival_s)
    constant = make_workload(WorkloadSpec(4, "constant", 0.5, (2, 5), (3, 9), 256, seed=5))
    assert [r.arrival_s for r in constant] == [0.0, 0.5, 1.0, 1.5]
    with pytest.raises(ValueError, match="negative"):
        make_workload(WorkloadSpec(4, "constant", -1.0, (2, 5), (3, 9), 256, seed=5))


def test_hf_cb_search_sizes_blocks_for_the_whole_trace_and_probes_the_same_work():
    from neoxlab.serve.hf_cb_tune import blocks_for, probe_of

    reqs = make_workload(WorkloadSpec(20, "poisson", 0.02, (5, 9), (40, 80), 50, 3))
    pages = [-(-(len(r.prompt) + r.max_new_tokens) // 16) for r in reqs]
    assert blocks_for(reqs, 16, 1.0) == sum(pages)
    assert blocks_for(reqs, 16, 0.0) == max(pages)  # never too small for one request
    probe = probe_of(reqs, count=8, max_new=32)
    assert len(probe) == 8 and all(r.arrival_s == 0.0 for r in probe)
    assert all(p.max_new_tokens == min(r.max_new_tokens, 32) and p.prompt == r.prompt
               for p, r in zip(probe, reqs, strict=False))
