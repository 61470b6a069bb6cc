"""Parked decoding decisions (lenpred.serving.parked) with the unified policies: hand-worked cases, the shared
config, and a policy registered in one class."""

import math
from dataclasses import dataclass

import pytest

from lenpred.errors import LenpredError
from lenpred.serving.parked import (SchedulerConfig, admission_limit, admission_priority, choose_decoders,
                                    preemption_order)
from lenpred.serving.policies import POLICIES, Policy, RequestView, build_policy, register


def req(i, arrival, total=math.inf, remaining=None, decoding=False, idle=0.0, new_block=False, prompt=10, waited=0.0):
    return RequestView(f"r{i}", arrival, prompt, 0, total, total if remaining is None else remaining, decoding, idle,
                       0, waited, new_block)


def pol(name, **kw):
    """A policy with no guard unless given (``max_idle_s`` etc.)."""
    return build_policy(name, **kw)


def test_sjf_gives_free_slots_to_the_shortest_prediction():
    # two slots, nobody decoding yet: the 50- and 80-token predictions decode, the 300 and 120 park
    rs = [req(0, 0.0, 300), req(1, 1.0, 50), req(2, 2.0, 120), req(3, 3.0, 80)]
    d = choose_decoders(rs, pol("sjf"), 2)
    assert d.decode == ("r1", "r3")
    assert d.parked == ("r2", "r0")


def test_sjf_is_non_preemptive_and_srpt_is_preemptive():
    # r0 decodes with 200 tokens to go; r1 (prediction 10) arrives: SJF keeps r0, SRPT swaps
    rs = [req(0, 0.0, 500, remaining=200, decoding=True), req(1, 1.0, 10)]
    assert choose_decoders(rs, pol("sjf"), 1).decode == ("r0",)
    srpt = choose_decoders(rs, pol("srpt"), 1)
    assert srpt.decode == ("r1",) and srpt.parked == ("r0",)


def test_srpt_hysteresis_keeps_a_near_tied_incumbent():
    # incumbent 30 to go, challenger 20: 30 - 16 = 14 < 20, the incumbent keeps the slot; challenger 10 wins
    inc = req(0, 0.0, 100, remaining=30, decoding=True)
    margin = pol("srpt", switch_margin_tokens=16.0)
    assert choose_decoders([inc, req(1, 1.0, 20)], margin, 1).decode == ("r0",)
    assert choose_decoders([inc, req(1, 1.0, 10)], margin, 1).decode == ("r1",)
    assert choose_decoders([inc, req(1, 1.0, 20)], pol("srpt"), 1).decode == ("r1",)


def test_fcfs_orders_by_arrival_and_keeps_incumbents():
    rs = [req(0, 5.0, 10), req(1, 1.0, 900), req(2, 3.0, 1, decoding=True)]
    assert choose_decoders(rs, pol("fcfs"), 2).decode == ("r2", "r1")


def test_hrrn_ranks_by_response_ratio_on_prompt_tokens():
    # 10 tokens/s of waiting: r0 (100 prompt tokens, waited 20 s) has ratio (200 + 100) / 100 = 3; r1 (10 tokens,
    # waited 1 s) (10 + 10) / 10 = 2; r2 (40 tokens, waited 0 s) 1: one slot goes to r0, the long prompt that waited
    hrrn = pol("hrrn", tokens_per_s=10.0)
    rs = [req(0, 0.0, prompt=100, waited=20.0), req(1, 19.0, prompt=10, waited=1.0), req(2, 20.0, prompt=40)]
    assert hrrn.rank(rs[0]) == -3.0 and hrrn.rank(rs[1]) == -2.0 and hrrn.rank(rs[2]) == -1.0
    assert choose_decoders(rs, hrrn, 1).decode == ("r0",)
    # equal waits: shortest prompt first; it reads no prediction and its rank is a ratio (aging leaves it alone)
    same = [req(0, 0.0, prompt=100, waited=5.0), req(1, 0.0, prompt=10, waited=5.0)]
    assert choose_decoders(same, pol("hrrn", aging_tokens_per_s=5.0), 1).decode == ("r1",)
    assert (POLICIES["hrrn"].reads_prediction, POLICIES["hrrn"].rank_unit) == (False, "ratio")
    with pytest.raises(LenpredError, match="tokens_per_s must be > 0"):
        pol("hrrn", tokens_per_s=0.0)


def test_starvation_guard_promotes_the_longest_idle():
    # r0 (long) parked for 61 s: promoted ahead of the short r1; r2 idle 70 s ranks before r0
    guard = pol("sjf", max_idle_s=60.0)
    rs = [req(0, 0.0, 900, idle=61.0), req(1, 1.0, 10), req(2, 2.0, 800, idle=70.0)]
    d = choose_decoders(rs, guard, 2)
    assert d.decode == ("r2", "r0") and d.promoted == ("r2", "r0") and d.parked == ("r1",)
    # under SJF an incumbent is not displaced by a promoted one; under SRPT it is
    rs = [req(0, 0.0, 900, idle=61.0), req(1, 1.0, 10, decoding=True)]
    assert choose_decoders(rs, guard, 1).decode == ("r1",)
    assert choose_decoders(rs, pol("srpt", max_idle_s=60.0), 1).decode == ("r0",)
    assert choose_decoders(rs, pol("sjf"), 1).promoted == ()


def test_the_age_threshold_promotes_the_overdue_until_they_finish_in_arrival_order():
    # SRPT, one slot, 60 s threshold: r0 (900 tokens to go) waited 61 s, r1 (10) 11 s: r0 is overdue and decodes
    wait = pol("srpt", max_wait_s=60.0)
    rs = [req(0, 0.0, 900, idle=61.0, waited=61.0), req(1, 50.0, 10, waited=11.0)]
    d = choose_decoders(rs, wait, 1)
    assert d.decode == ("r0",) and d.promoted == ("r0",) and d.parked == ("r1",)
    assert wait.overdue(rs[0]) and not wait.overdue(rs[1]) and wait.label == "srpt+wait60s"
    # once decoding it stays promoted (an idle promotion lasts one step: SRPT then hands the slot back to r1)
    rs = [req(0, 0.0, 900, remaining=899, decoding=True, waited=62.0), req(1, 50.0, 10, waited=12.0)]
    assert choose_decoders(rs, wait, 1).decode == ("r0",)
    assert choose_decoders(rs, pol("srpt", max_idle_s=60.0), 1).decode == ("r1",)
    # the overdue among themselves in arrival order, whatever their rank: r3 (arrived 10 s) before r4 (20 s); r5 waits
    rs = [req(4, 20.0, 5, waited=80.0), req(3, 10.0, 700, waited=90.0), req(5, 85.0, 1, waited=5.0)]
    assert choose_decoders(rs, wait, 2).decode == ("r3", "r4")
    assert choose_decoders(rs, pol("srpt"), 2).decode == ("r5", "r4")  # unguarded: shortest remaining
    # non-preemptive SJF: an incumbent keeps its slot, the overdue one takes the next free slot
    rs = [req(0, 0.0, 900, waited=61.0), req(1, 50.0, 10, decoding=True, waited=11.0), req(2, 55.0, 5, waited=6.0)]
    assert choose_decoders(rs, pol("sjf", max_wait_s=60.0), 2).decode == ("r1", "r0")
    assert choose_decoders(rs, pol("sjf"), 2).decode == ("r1", "r2")


def test_delay_dependent_priority_ranks_prediction_plus_rate_times_arrival():
    # SRPT, one slot: r0 arrived at 0 s with 100 tokens to go, r1 at 30 s with 40. Without aging r1 decodes; at
    # 1 token/s r0's rank is 100 + 0 = 100 and r1's 40 + 30 = 70: r1 still; at 3 tokens/s r1's is 130: r0 decodes
    rs = [req(0, 0.0, 100), req(1, 30.0, 40)]
    assert choose_decoders(rs, pol("srpt"), 1).decode == ("r1",)
    assert choose_decoders(rs, pol("srpt", aging_tokens_per_s=1.0), 1).decode == ("r1",)
    assert pol("srpt", aging_tokens_per_s=3.0).key(rs[1]) == (130.0, 30.0, "r1")
    assert choose_decoders(rs, pol("srpt", aging_tokens_per_s=3.0), 1).decode == ("r0",)
    # the rank persists while r0 decodes (unlike a one-step promotion): r0, now decoding with 90 to go, keeps the slot
    rs = [req(0, 0.0, 100, remaining=90, decoding=True), req(1, 30.0, 40)]
    assert choose_decoders(rs, pol("srpt", aging_tokens_per_s=3.0), 1).decode == ("r0",)
    # fcfs ranks in seconds: aging leaves it as it is
    assert choose_decoders(rs, pol("fcfs", aging_tokens_per_s=3.0), 1).decode == ("r0",)
    # admission by prompt length: round(200 + 2 × 12.4) = 225; arrival order ignores both
    assert admission_priority("prompt_len", 200, 12.4, 2.0) == 225
    assert admission_priority("prompt_len", 200) == 200 and admission_priority("arrival", 200, 12.4, 2.0) == 0
    with pytest.raises(LenpredError, match=r"rate \(aging_tokens_per_s\) must be a number >= 0"):
        pol("srpt", aging_tokens_per_s=-1.0)


def test_kv_budget_parks_the_longest_remaining_decoders_that_need_a_block():
    # three decoders, two need a new block, one block free: the one with 400 to go is parked
    rs = [req(0, 0.0, 50, new_block=True), req(1, 1.0, 400, new_block=True), req(2, 2.0, 60)]
    d = choose_decoders(rs, pol("sjf"), 3, free_kv_blocks=1)
    assert d.decode == ("r0", "r2") and d.kv_parked == ("r1",) and d.parked == ("r1",)
    # no block free at all: at least one decoder stays (the engine's preemption takes over from there)
    d = choose_decoders([req(0, 0.0, 50, new_block=True), req(1, 1.0, 400, new_block=True)], pol("sjf"), 2,
                        free_kv_blocks=0)
    assert d.decode == ("r0",)


def test_preemption_order_is_the_policys_victim_order_longest_remaining_first():
    rs = [req(0, 0.0, 100, remaining=30), req(1, 1.0, 100, remaining=90), req(2, 2.0), req(3, 3.0, 100, remaining=90)]
    assert preemption_order(rs, pol("sjf")) == ["r2", "r3", "r1", "r0"]


def test_bad_arguments_are_refused():
    with pytest.raises(LenpredError, match="needs a built Policy, got str"):
        choose_decoders([], "sjf", 1)
    with pytest.raises(LenpredError, match="decode_slots must be >= 1"):
        choose_decoders([], pol("sjf"), 0)
    with pytest.raises(LenpredError, match="unknown policy 'lifo'; valid policies: fcfs, random, sjf, srpt, hrrn"):
        build_policy("lifo")


def test_admission_limit_is_max_num_seqs_capped_by_prefill_ahead():
    assert admission_limit(8, 4, None) == 8
    assert admission_limit(8, 4, 2) == 6  # 4 decoding + 2 prefilled ahead
    assert admission_limit(5, 4, 2) == 5 and admission_limit(8, 1, 0) == 1


def test_scheduler_config_builds_the_policy_with_its_guards_and_refuses_bad_settings():
    cfg = SchedulerConfig()  # the measured design
    assert (cfg.policy, cfg.decode_slots, cfg.prefill_ahead, cfg.admit_by) == ("srpt", 16, 16, "prompt_len")
    policy = SchedulerConfig(policy="srpt", max_idle_s=5.0, switch_margin_tokens=8.0, aging_tokens_per_s=2.0,
                             ).make_policy("oracle")
    assert (policy.predictor, policy.max_idle_s, policy.switch_margin_tokens, policy.aging_tokens_per_s) == (
        "oracle", 5.0, 8.0, 2.0)
    assert SchedulerConfig(policy="fcfs", max_idle_s=60.0).make_policy() == build_policy("fcfs", max_idle_s=60.0)
    assert SchedulerConfig().make_policy().max_idle_s is None  # measured without idle promotion
    assert SchedulerConfig(max_wait_s=120.0).make_policy("oracle").max_wait_s == 120.0
    assert SchedulerConfig().make_policy().max_wait_s is None
    for bad, msg in (({"policy": "nope"}, "policy 'nope' is unknown; valid: fcfs, random, sjf, srpt, hrrn"),
                     ({"admit_by": "lifo"}, "admit_by 'lifo' is unknown"),
                     ({"decode_slots": 0}, "decode_slots must be an integer >= 1"),
                     ({"max_idle_s": -1.0}, "max_idle_s must be a number >= 0 or null"),
                     ({"max_wait_s": -1.0}, "max_wait_s must be a number >= 0 or null"),
                     ({"policy_options": {"max_wait_s": 5.0}}, "policy srpt has no option.s. max_wait_s")):
        with pytest.raises(LenpredError, match=msg):
            SchedulerConfig(**bad)


@pytest.fixture
def longest_first():
    """``lpt``, longest static prediction first (non-preemptive), registered for one test: one class, nothing else."""
    @register("lpt")
    @dataclass(frozen=True)
    class LongestFirst(Policy):
        reads_prediction = True

        def rank(self, view):
            return -view.predicted_total

    yield LongestFirst
    del POLICIES["lpt"]


def test_a_policy_registered_in_one_class_is_chosen_and_simulated_by_name(longest_first):
    from lenpred.serving.cost_model import CostModel
    from lenpred.serving.simulator import SimConfig, simulate_parked
    from lenpred.studies.workload import WorkloadRequest

    rs = [req(0, 0.0, 300), req(1, 1.0, 50), req(2, 2.0, 120, decoding=True), req(3, 3.0, 800)]
    d = choose_decoders(rs, build_policy("lpt"), 2)  # the incumbent keeps its slot, the free one goes to 800
    assert d.decode == ("r2", "r3") and d.parked == ("r0", "r1")
    # the simulator: 3 requests of 2, 4 and 3 tokens at t = 0, one slot, 1 s per forward (prefill fused with decode).
    # t = 1 prefills all three (first token each); longest first: r1 (3 more: t = 4), r2 (2 more: t = 6), r0 (t = 7)
    unit = CostModel("unit", {"p0": 1.0, "p1": 0.0, "p2": 0.0, "d0": 1.0, "d1": 0.0, "d2": 0.0}, fused_prefill=True)
    reqs = [WorkloadRequest(i, [], n, 64, "longseq", f"p{i}", {"oracle": float(n)}, num_prompt_tokens=10)
            for i, n in enumerate([2, 4, 3])]
    cfg = SchedulerConfig("lpt", decode_slots=1, max_idle_s=None, admit_by="arrival")
    summary, timings = simulate_parked(reqs, cfg, unit, SimConfig(max_num_seqs=8), predictor="oracle")
    assert [t.jct_s for t in timings] == [7, 4, 6] and summary["num_preemptions"] == 0
    _, timings = simulate_parked(reqs, SchedulerConfig("sjf", decode_slots=1, max_idle_s=None), unit,
                                 SimConfig(max_num_seqs=8), predictor="oracle")
    assert [t.jct_s for t in timings] == [2, 7, 4]  # shortest first, for contrast
    with pytest.raises(LenpredError, match="parked lpt ranks by a prediction: pass predictor="):
        simulate_parked(reqs, cfg, unit, SimConfig(max_num_seqs=8), predictor=None)


def test_boost_is_arrival_minus_the_gamma_boost_of_the_work():
    import math

    from lenpred.serving.policies import boost

    # b_γ(w) = (1/γ) ln(1/(1 − e^(−γw))): γ = 0.5/s, w = 2 s: 2 · ln(1/(1 − e^-1)) = 2 · 0.458675 = 0.91735
    assert boost(2.0, 0.5) == pytest.approx(2 * math.log(1 / (1 - math.exp(-1))))
    assert boost(0.1, 0.5) > boost(2.0, 0.5) > boost(20.0, 0.5)  # short jobs are boosted most
    b = pol("boost", gamma_per_s=0.5, tokens_per_s=10.0)
    # r0 arrived at 0 with a 200-token prompt (20 s: boost 2·ln(1/(1−e^-10)) ≈ 0.0001); r1 at 1.5 s with a 20-token
    # prompt (2 s: boost 0.917): r1's boosted arrival 0.583 > r0's ≈ 0, so r0 first; at 0.5 s, r1 (−0.417) goes first
    far, near = req(1, 1.5, prompt=20), req(1, 0.5, prompt=20)
    assert b.rank(far) == pytest.approx(1.5 - 0.91735, abs=1e-4)
    assert choose_decoders([req(0, 0.0, prompt=200), far], b, 1).decode == ("r0",)
    assert choose_decoders([req(0, 0.0, prompt=200), near], b, 1).decode == ("r1",)
    # on the predicted length instead: the same boost of 20 predicted tokens
    assert pol("boost_predicted", gamma_per_s=0.5, tokens_per_s=10.0).rank(req(1, 1.5, 20, prompt=999)) == \
        pytest.approx(b.rank(far))
    assert POLICIES["boost_predicted"].reads_prediction and not POLICIES["boost"].reads_prediction


def test_las_levels_double_their_quanta_and_skip_join_by_prompt():
    from dataclasses import replace

    las = pol("las", quantum_tokens=16, prompt_tokens_per_token=16.0)
    level = lambda prompt, generated: las.level(replace(req(0, 0.0, prompt=prompt), num_output_tokens=generated))  # noqa
    # quanta 16, 32, 64: level 0 for 0-15 tokens, 1 for 16-47, 2 for 48-111
    assert [level(10, g) for g in (0, 15, 16, 47, 48, 111, 112)] == [0, 0, 1, 1, 2, 2, 3]
    # a 600-token prompt costs 600/16 = 37.5 tokens: it skips the 16- and 32-token levels (needs 64 ≥ 37.5)
    assert level(600, 0) == 2 and level(600, 63) == 2 and level(600, 64) == 3
    # preemptive: a request demoted to level 1 loses its slot to a fresh one; KV pressure takes the lowest level first
    old, new = replace(req(0, 0.0, prompt=10, decoding=True), num_output_tokens=20), req(1, 5.0, prompt=10)
    assert choose_decoders([old, new], las, 1).decode == ("r1",)
    assert preemption_order([new, old], las) == ["r0", "r1"]
    assert las.tokens_to_rank_change(old) == 48 - 20 and las.tokens_to_rank_change(new) == 16


def test_a_policys_own_options_pass_through_the_shared_config_and_unknown_ones_are_refused():
    hrrn = SchedulerConfig(policy="hrrn", policy_options={"tokens_per_s": 2000.0}).make_policy()
    assert hrrn.tokens_per_s == 2000.0  # e.g. a GPU's throughput instead of this CPU's default 60
    las = SchedulerConfig(policy="las", policy_options={"quantum_tokens": 4}).make_policy()
    assert las.level(RequestView("r", 0.0, 10, 4)) == 1  # quantum 4: the first level holds 4 tokens
    with pytest.raises(LenpredError, match="policy hrrn has no option.s. gamma_per_s; its own: tokens_per_s"):
        SchedulerConfig(policy="hrrn", policy_options={"gamma_per_s": 1.0})
    with pytest.raises(LenpredError, match="policy sjf has no option.s. max_idle_s; its own: none"):
        SchedulerConfig(policy="sjf", policy_options={"max_idle_s": 5.0})  # a shared setting is set as one
