"""Parked decoding decisions (lenpred.serving.parked): hand-worked cases, and the policy registry."""

import math
from dataclasses import dataclass

import pytest

from lenpred.errors import LenpredError
from lenpred.serving.parked import (PARKED_POLICIES, ParkedPolicy, ParkedSJF, ParkedSRPT, SlotRequest, admission_limit,
                                    admission_priority, choose_decoders, make_parked_policy, preemption_order,
                                    register_parked)


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


def test_delay_dependent_priority_ranks_prediction_plus_rate_times_arrival():
    # SRPT, one slot: r0 arrived at 0 s with 100 tokens to go, r1 at 30 s with 40. Without aging r1 decodes; at
    # 1 token/s r0's rank is 100 + 0 = 100 and r1's 40 + 30 = 70: r1 still; at 3 tokens/s r1's is 130: r0 decodes
    rs = [req(0, 0.0, 100), req(1, 30.0, 40)]
    assert choose_decoders(rs, "srpt", 1, max_idle_s=None).decode == ("r1",)
    assert choose_decoders(rs, "srpt", 1, max_idle_s=None, aging_tokens_per_s=1.0).decode == ("r1",)
    assert choose_decoders(rs, "srpt", 1, max_idle_s=None, aging_tokens_per_s=3.0).decode == ("r0",)
    # the rank persists while r0 decodes (unlike a one-step promotion): r0, now decoding with 90 to go, keeps the slot
    rs = [req(0, 0.0, 100, remaining=90, decoding=True), req(1, 30.0, 40)]
    assert choose_decoders(rs, "srpt", 1, max_idle_s=None, aging_tokens_per_s=3.0).decode == ("r0",)
    # fcfs reads no prediction: aging leaves it as it is
    assert choose_decoders(rs, "fcfs", 1, aging_tokens_per_s=3.0).decode == ("r0",)
    # admission by prompt length: round(200 + 2 × 12.4) = 225; arrival order ignores both
    assert admission_priority("prompt_len", 200, 12.4, 2.0) == 225
    assert admission_priority("prompt_len", 200) == 200 and admission_priority("arrival", 200, 12.4, 2.0) == 0
    with pytest.raises(LenpredError, match="aging must be a number >= 0"):
        choose_decoders(rs, "srpt", 1, aging_tokens_per_s=-1.0)


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


def test_admission_limit_is_max_num_seqs_capped_by_prefill_ahead():
    assert admission_limit(8, 4, None) == 8
    assert admission_limit(8, 4, 2) == 6  # 4 decoding + 2 prefilled ahead
    assert admission_limit(5, 4, 2) == 5 and admission_limit(8, 1, 0) == 1


def test_registered_policies_carry_the_properties_the_engine_and_simulator_act_on():
    assert list(PARKED_POLICIES) == ["fcfs", "sjf", "srpt"]
    assert make_parked_policy("sjf") == ParkedSJF() and make_parked_policy(ParkedSRPT()) == ParkedSRPT()
    flags = {name: (cls.reads_prediction, cls.reads_remaining, cls.preemptive) for name, cls in PARKED_POLICIES.items()}
    assert flags == {"fcfs": (False, False, False), "sjf": (True, False, False), "srpt": (True, True, True)}
    assert choose_decoders([req(0, 0.0, 500, decoding=True), req(1, 1.0, 10)], ParkedSRPT(), 1).decode == ("r1",)
    with pytest.raises(LenpredError, match="parked policy name 'sjf' is already registered by ParkedSJF"):
        register_parked("sjf")(type("Other", (ParkedPolicy,), {}))
    assert PARKED_POLICIES["sjf"] is ParkedSJF


@pytest.fixture
def longest_first():
    """``lpt``, longest static prediction first (non-preemptive), registered for one test: one class, nothing else."""
    @register_parked("lpt")
    @dataclass(frozen=True)
    class LongestFirst(ParkedPolicy):
        reads_prediction = True

        def key(self, request, switch_margin_tokens):
            return (-request.predicted_total, request.arrival_time_s, request.request_id)

    yield LongestFirst
    del PARKED_POLICIES["lpt"]


def test_a_policy_registered_in_one_class_is_chosen_and_simulated_by_name(longest_first):
    from lenpred.serving.cost_model import CostModel
    from lenpred.serving.simulator import ParkedConfig, SimConfig, simulate_parked
    from lenpred.studies.workload import WorkloadRequest

    rs = [req(0, 0.0, 300), req(1, 1.0, 50), req(2, 2.0, 120, decoding=True), req(3, 3.0, 800)]
    d = choose_decoders(rs, "lpt", 2)  # the incumbent keeps its slot (not preemptive), the free one goes to 800
    assert d.decode == ("r2", "r3") and d.parked == ("r0", "r1")
    with pytest.raises(LenpredError, match="unknown parked policy 'nope'; valid: fcfs, sjf, srpt, lpt"):
        choose_decoders(rs, "nope", 1)
    # the simulator: 3 requests of 2, 4 and 3 tokens at t = 0, one slot, 1 s per forward (prefill fused with decode).
    # t = 1 prefills all three (first token each); longest first: r1 (3 more: t = 4), r2 (2 more: t = 6), r0 (t = 7)
    unit = CostModel("unit", {"p0": 1.0, "p1": 0.0, "p2": 0.0, "d0": 1.0, "d1": 0.0, "d2": 0.0}, fused_prefill=True)
    reqs = [WorkloadRequest(i, [], n, 64, "longseq", f"p{i}", {"oracle": float(n)}, num_prompt_tokens=10)
            for i, n in enumerate([2, 4, 3])]
    cfg = ParkedConfig("lpt", "oracle", decode_slots=1, max_idle_s=None)
    assert cfg.label == "parked_lpt:oracle"
    summary, timings = simulate_parked(reqs, cfg, unit, SimConfig(max_num_seqs=8))
    assert [t.jct_s for t in timings] == [7, 4, 6] and summary["num_preemptions"] == 0
    _, timings = simulate_parked(reqs, ParkedConfig("sjf", "oracle", decode_slots=1, max_idle_s=None), unit,
                                 SimConfig(max_num_seqs=8))
    assert [t.jct_s for t in timings] == [2, 7, 4]  # shortest first, for contrast
    with pytest.raises(LenpredError, match="parked lpt needs a predictor"):
        ParkedConfig("lpt", None)
    with pytest.raises(LenpredError, match="unknown parked policy 'nope'"):
        ParkedConfig("nope", "oracle")
