"""Parked decoding decisions (lenpred.serving.parked): hand-worked cases."""

import math

import pytest

from lenpred.errors import LenpredError
from lenpred.serving.parked import SlotRequest, choose_decoders, preemption_order


def req(i, arrival, total=math.inf, remaining=None, decoding=False, idle=0.0, new_block=False):
    return SlotRequest(f"r{i}", arrival, total, total if remaining is None else remaining, decoding, idle, new_block)


def test_sjf_gives_free_slots_to_the_shortest_prediction():
    # two slots, nobody decoding yet: the 50- and 80-token predictions decode, the 300 and 120 park
    rs = [req(0, 0.0, 300), req(1, 1.0, 50), req(2, 2.0, 120), req(3, 3.0, 80)]
    d = choose_decoders(rs, "sjf", 2)
    assert d.decode == ("r1", "r3")
    assert d.parked == ("r2", "r0")


def test_sjf_is_non_preemptive_and_srpt_is_preemptive():
    # r0 decodes with 200 tokens to go; r1 (prediction 10) arrives: SJF keeps r0, SRPT swaps
    rs = [req(0, 0.0, 500, remaining=200, decoding=True), req(1, 1.0, 10)]
    assert choose_decoders(rs, "sjf", 1).decode == ("r0",)
    srpt = choose_decoders(rs, "srpt", 1)
    assert srpt.decode == ("r1",) and srpt.parked == ("r0",)


def test_srpt_hysteresis_keeps_a_near_tied_incumbent():
    # incumbent 30 to go, challenger 20: 30 - 16 = 14 < 20, the incumbent keeps the slot; challenger 10 wins
    inc = req(0, 0.0, 100, remaining=30, decoding=True)
    assert choose_decoders([inc, req(1, 1.0, 20)], "srpt", 1).decode == ("r0",)
    assert choose_decoders([inc, req(1, 1.0, 10)], "srpt", 1).decode == ("r1",)
    assert choose_decoders([inc, req(1, 1.0, 20)], "srpt", 1, switch_margin_tokens=0).decode == ("r1",)


def test_fcfs_orders_by_arrival_and_keeps_incumbents():
    rs = [req(0, 5.0, 10), req(1, 1.0, 900), req(2, 3.0, 1, decoding=True)]
    assert choose_decoders(rs, "fcfs", 2).decode == ("r2", "r1")


def test_starvation_guard_promotes_the_longest_idle():
    # r0 (long) parked for 61 s: promoted ahead of the short r1; r2 idle 70 s ranks before r0
    rs = [req(0, 0.0, 900, idle=61.0), req(1, 1.0, 10), req(2, 2.0, 800, idle=70.0)]
    d = choose_decoders(rs, "sjf", 2, max_idle_s=60.0)
    assert d.decode == ("r2", "r0") and d.promoted == ("r2", "r0") and d.parked == ("r1",)
    # under SJF an incumbent is not displaced by a promoted one; under SRPT it is
    rs = [req(0, 0.0, 900, idle=61.0), req(1, 1.0, 10, decoding=True)]
    assert choose_decoders(rs, "sjf", 1, max_idle_s=60.0).decode == ("r1",)
    assert choose_decoders(rs, "srpt", 1, max_idle_s=60.0).decode == ("r0",)
    assert choose_decoders(rs, "sjf", 1, max_idle_s=None).promoted == ()


def test_kv_budget_parks_the_longest_remaining_decoders_that_need_a_block():
    # three decoders, two need a new block, one block free: the one with 400 to go is parked
    rs = [req(0, 0.0, 50, new_block=True), req(1, 1.0, 400, new_block=True), req(2, 2.0, 60)]
    d = choose_decoders(rs, "sjf", 3, free_kv_blocks=1)
    assert d.decode == ("r0", "r2") and d.kv_parked == ("r1",) and d.parked == ("r1",)
    # no block free at all: at least one decoder stays (the engine's preemption takes over from there)
    d = choose_decoders([req(0, 0.0, 50, new_block=True), req(1, 1.0, 400, new_block=True)], "sjf", 2,
                        free_kv_blocks=0)
    assert d.decode == ("r0",)


def test_preemption_order_is_longest_remaining_first():
    rs = [req(0, 0.0, 100, remaining=30), req(1, 1.0, 100, remaining=90), req(2, 2.0), req(3, 3.0, 100, remaining=90)]
    assert preemption_order(rs) == ["r2", "r3", "r1", "r0"]


def test_bad_arguments_are_refused():
    with pytest.raises(LenpredError, match="unknown parked policy 'lifo'; valid: fcfs, sjf, srpt"):
        choose_decoders([], "lifo", 1)
    with pytest.raises(LenpredError, match="decode_slots must be >= 1"):
        choose_decoders([], "sjf", 0)
