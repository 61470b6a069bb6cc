"""The scheduling policies and the simulator (lenpred.serving.policies, lenpred.serving.simulator) on hand-worked
workloads: static and continuous batching, preemption, parked decoding, the KV cache, the prediction's cost."""

import numpy as np
import pyarrow as pa
import pytest

from lenpred.errors import LenpredError
from lenpred.serving.cost_model import CostModel
from lenpred.serving.policies import make_policy, padding_ratio, progressive_remaining, static_batches, workload_view
from lenpred.serving.simulator import SimConfig, arrival_times, simulate
from lenpred.studies.workload import WorkloadRequest


def unit_cost(fused: bool = False) -> CostModel:
    """Prefill 1 s, decode step 1 s, whatever the sizes: every time below is a count of forwards."""
    return CostModel("unit", {"p0": 1.0, "p1": 0.0, "p2": 0.0, "d0": 1.0, "d1": 0.0, "d2": 0.0}, fused_prefill=fused)


def req(i: int, length: int, pred: float | None = None, prompt: int = 10, arrival: float = 0.0) -> WorkloadRequest:
    return WorkloadRequest(i, [], length, 64, "longseq", f"p{i}",
                           {"oracle": float(length), "est": float(length if pred is None else pred)},
                           num_prompt_tokens=prompt, arrival_time_s=arrival)


LENGTHS = [4, 1, 3, 2]


def test_padding_ratio_hand_worked():
    # batches [4, 1] and [3, 2]: useful 10 of 2·4 + 2·3 = 14 slots
    assert padding_ratio([[4, 1], [3, 2]]) == pytest.approx(1 - 10 / 14)
    assert padding_ratio([[1, 2], [3, 4]]) == pytest.approx(1 - 10 / (2 * 2 + 2 * 4))
    assert padding_ratio([[5, 5, 5]]) == 0.0
    with pytest.raises(LenpredError):
        padding_ratio([[0, 0]])


def test_static_fcfs_and_oracle_hand_worked():
    reqs = [req(i, L) for i, L in enumerate(LENGTHS)]
    cfg = SimConfig(batching="static", max_num_seqs=2)
    # FCFS batches [4, 1], [3, 2]: each batch takes L_max forwards (1 prefill + L_max − 1 decodes) → ends 4, 7
    summary, timings = simulate(reqs, make_policy("fcfs"), unit_cost(), cfg)
    assert [t.jct_s for t in timings] == [4, 4, 7, 7]
    assert [t.ttft_s for t in timings] == [1, 1, 5, 5]
    assert summary["mean_jct_s"] == 5.5
    assert summary["padding_ratio"] == pytest.approx(4 / 14)
    assert summary["throughput_tok_s"] == pytest.approx(10 / 7)
    # SJF by true length: batches [1, 2], [3, 4] → ends 2, 6
    summary, timings = simulate(reqs, make_policy("sjf:oracle"), unit_cost(), cfg)
    assert [t.jct_s for t in timings] == [6, 2, 6, 2]
    assert summary["mean_jct_s"] == 4.0
    assert summary["padding_ratio"] == pytest.approx(2 / 12)


def test_static_batches_sort_by_prediction():
    reqs = [req(i, L, pred=p) for i, (L, p) in enumerate(zip(LENGTHS, [1, 9, 2, 8]))]
    batches = static_batches(reqs, 2, make_policy("sjf:est"))
    assert [[r.request_id for r in b] for b in batches] == [[0, 2], [3, 1]]
    with pytest.raises(LenpredError, match="preempts"):
        static_batches(reqs, 2, make_policy("srpt:est"))


def test_continuous_fcfs_hand_worked():
    # max 2 running, unit cost, separate prefill forward: t=1 r0,r1 prefilled (r1 done); t=3 r2 prefilled while r0
    # decodes (1 + 1 s); t=5 r0 and r2 done after 2 decodes; t=6 r3 prefilled; t=7 r3 done
    reqs = [req(i, L) for i, L in enumerate(LENGTHS)]
    summary, timings = simulate(reqs, make_policy("fcfs"), unit_cost(), SimConfig(max_num_seqs=2))
    assert [t.finish_time_s for t in timings] == [5, 1, 5, 7]
    assert [t.ttft_s for t in timings] == [1, 1, 3, 6]
    assert summary["mean_jct_s"] == 4.5
    assert summary["makespan_s"] == 7
    assert summary["padding_ratio"] is None


def test_srpt_limited_preemption_hand_worked():
    # one slot; r0 (4 tokens) at 0, r1 (1 token) at 1.5. FCFS: r0 ends at 4, r1 prefilled at 5.
    cfg = SimConfig(max_num_seqs=1)
    from lenpred.serving.simulator import _Continuous

    def run(policy):
        return _Continuous([req(0, 4), req(1, 1, arrival=1.5)], make_policy(policy), unit_cost(), cfg).run()

    _, fcfs = run("fcfs")
    assert [t.finish_time_s for t in fcfs] == [4, 5]
    # SRPT: at t=2 r0 has 2 tokens (< 0.8·4) and 2 left > r1's 1 → preempted; r1 prefilled, done at 3; r0
    # recomputed (prefill of prompt + 2 tokens) at 4 and decodes its last token at 5
    summary, srpt = run("srpt:oracle")
    assert [t.finish_time_s for t in srpt] == [5, 3]
    assert [t.num_preemptions for t in srpt] == [1, 0]
    assert summary["mean_jct_s"] == pytest.approx((5 + 1.5) / 2)


def test_srpt_no_preemption_past_fraction():
    # r0 predicted 2 tokens: after its prefill + 1 decode it has 2 ≥ 0.8·2 → not preemptible
    from lenpred.serving.simulator import _Continuous

    run = _Continuous([req(0, 4, pred=2), req(1, 1, arrival=1.5)], make_policy("srpt:est"), unit_cost(),
                      SimConfig(max_num_seqs=1)).run
    _, timings = run()
    assert [t.num_preemptions for t in timings] == [0, 0]
    assert [t.finish_time_s for t in timings] == [4, 5]


def test_aging_promotes_a_starved_request():
    # one slot, SJF by a prediction that ranks r0 last forever; r1..r3 keep arriving shorter. With aging 2 the
    # starved r0 is promoted after 2 steps of waiting and runs before r3.
    reqs = [req(0, 2, arrival=0.5), req(1, 3, pred=1), req(2, 3, pred=1, arrival=0.5), req(3, 3, pred=1, arrival=2.5)]
    from lenpred.serving.simulator import _Continuous

    _, plain = _Continuous(reqs, make_policy("sjf:est"), unit_cost(), SimConfig(max_num_seqs=1)).run()
    _, aged = _Continuous(reqs, make_policy("sjf:est", aging_steps=2), unit_cost(), SimConfig(max_num_seqs=1)).run()
    assert plain[0].finish_time_s == max(t.finish_time_s for t in plain)  # starved to the end
    assert aged[0].finish_time_s < aged[3].finish_time_s


def test_delay_dependent_priority_is_prediction_plus_rate_times_arrival():
    # the same workload as above: r0 (prediction 2) waits behind requests predicted 1. At 5 tokens/s of aging its
    # key is 2 + 5·0.5 = 4.5 and r3's is 1 + 5·2.5 = 13.5, so r0 runs before r3; without aging r0 is last
    reqs = [req(0, 2, arrival=0.5), req(1, 3, pred=1), req(2, 3, pred=1, arrival=0.5), req(3, 3, pred=1, arrival=2.5)]
    aged = make_policy("sjf:est", aging_tokens_per_s=5.0)
    assert [aged.key(workload_view(r, aged, 0, 0.0))[0] for r in reqs] == [4.5, 1.0, 3.5, 13.5]
    plain = make_policy("sjf:est")
    assert plain.key(workload_view(reqs[3], plain, 0, 0.0))[0] == 1.0
    from lenpred.serving.simulator import _Continuous  # keeps the requests' own arrival times

    finish = lambda policy: {t.request_id: t.finish_time_s  # noqa: E731
                             for t in _Continuous(reqs, policy, unit_cost(), SimConfig(max_num_seqs=1)).run()[1]}
    plain, guarded = finish(make_policy("sjf:est")), finish(aged)
    assert plain[0] == max(plain.values()) and guarded[0] < guarded[3]
    for bad in (-1.0, True, "4", None):  # a negative rate, and what is not a number (a bool is not one here)
        with pytest.raises(LenpredError, match=r"rate \(aging_tokens_per_s\) must be a number >= 0"):
            make_policy("sjf:est", aging_tokens_per_s=bad)


def test_fused_prefill_drops_second_overhead():
    reqs = [req(i, L) for i, L in enumerate(LENGTHS)]
    _, timings = simulate(reqs, make_policy("fcfs"), unit_cost(fused=True), SimConfig(max_num_seqs=2))
    # r2's prefill step now costs 1 (decode step) + 0 extra: t=2, then 2 decodes → 4; r3: 5, 6
    assert [t.finish_time_s for t in timings] == [4, 1, 4, 6]


def test_progressive_remaining_uses_latest_step():
    r = req(0, 100, pred=50)
    remaining = progressive_remaining({0: {0: 50.0, 8: 90.0}}, fallback=lambda q, g: -1.0, steps=(0, 8))
    assert remaining(r, 4) == 46.0
    assert remaining(r, 10) == 80.0
    assert remaining(req(5, 3), 0) == -1.0
    assert remaining.update_steps == (0, 8)


def test_srpt_re_ranks_on_a_progressive_re_prediction():
    # one slot; r0 (4 tokens, first estimate 4) at 0, r1 (1 token, estimate 3) at 1.5. At t = 2 r0 has 2 tokens
    # (< 0.8·4, preemptible). Countdown: r0 has 4 − 2 = 2 left < r1's 3 → r0 keeps running: [4, 5]. A re-prediction
    # at step 2 says r0 is 20 long (18 left) → r0 is preempted, r1 runs 2→3, r0 recomputes 3→4 and ends at 5.
    from lenpred.serving.simulator import _Continuous

    reqs = [req(0, 4, pred=4), req(1, 1, pred=3, arrival=1.5)]
    cfg = SimConfig(max_num_seqs=1)
    _, countdown = _Continuous(reqs, make_policy("srpt:est"), unit_cost(), cfg).run()
    assert [t.finish_time_s for t in countdown] == [4, 5]
    remaining = progressive_remaining({0: {0: 4.0, 2: 20.0}, 1: {0: 3.0}}, fallback=lambda q, g: -1.0, steps=(0, 2))
    _, progressive = _Continuous(reqs, make_policy("srpt:est", remaining=remaining), unit_cost(), cfg).run()
    assert [t.finish_time_s for t in progressive] == [5, 3]
    assert [t.num_preemptions for t in progressive] == [1, 0]


def test_policy_registry_errors():
    with pytest.raises(LenpredError, match="valid policies: fcfs, random, sjf, srpt"):
        make_policy("lifo")
    with pytest.raises(LenpredError, match="needs a predictor"):
        make_policy("sjf")
    with pytest.raises(LenpredError, match="reads no prediction"):
        make_policy("fcfs:estp")
    assert make_policy("sjf:estp", aging_steps=200).label == "sjf:estp+aging200"


def test_random_policy_is_seeded():
    reqs = [req(i, 1) for i in range(20)]
    def order(seed):
        policy = make_policy("random", seed=seed)
        return [r.request_id for r in sorted(reqs, key=lambda r: policy.key(workload_view(r, policy, 0, 0.0)))]

    assert order(3) == order(3) and order(3) != order(4) and sorted(order(3)) == list(range(20))


def test_arrival_times_mean_and_cv():
    gaps = np.diff(arrival_times(20001, "gamma", rate_per_s=4.0, cv=2.0, seed=0))
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)
    assert np.all(arrival_times(5, "all") == 0)
    with pytest.raises(LenpredError):
        SimConfig(arrival="uniform")


def test_generate_static_batch_exact_lengths(tiny_model_dir, one_torch_thread):
    # every row emits exactly its forced length (0 included) before the stop token, whatever the random model says
    from transformers import AutoModelForCausalLM

    from lenpred.studies.static_run import generate_static_batch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompts = [[2, 7, 8, 9], [2, 10], [2, 11, 12]]
    wall, produced = generate_static_batch(model, prompts, [5, 0, 2], stop_token_ids=(3,), pad_token_id=1)
    assert produced == [5, 0, 2] and wall > 0


def test_gain_share_and_report_tables(tmp_path):
    # FCFS 10 s, oracle 4 s, predictor 7 s on every draw: the predictor recovers exactly half the oracle's gain
    from lenpred.studies.simulate import METRICS, SimExperimentConfig, summarize_runs
    from lenpred.studies.scheduling_report import markdown, simulation_tables

    def summary(jct):
        return {m: (jct if m == "mean_jct_s" else 1.0) for m in METRICS} | {"padding_ratio": None}

    runs = {f"continuous/all/{p}": [summary(j), summary(j)] for p, j in
            (("fcfs", 10.0), ("sjf:estp", 7.0), ("sjf:oracle", 4.0))}
    cfg = SimExperimentConfig(predictors=("estp",), bootstrap_resamples=100)
    out = summarize_runs(runs, cfg)
    assert out["gain_share"]["continuous/all/sjf:estp"] == pytest.approx((0.5, 0.5, 0.5))
    assert out["rows"]["continuous/all/fcfs"]["mean_jct_s"] == pytest.approx((10.0, 10.0, 10.0))
    assert "padding_ratio" not in out["rows"]["continuous/all/fcfs"]
    header, rows = simulation_tables({"summary": out})["continuous/all"]
    assert header[0] == "policy" and header[-1] == "oracle-gain share"
    assert rows[1][0] == "sjf:estp" and rows[1][-1] == "0.50 [0.50, 0.50]"
    assert markdown(header, rows).count("\n") == 2 + len(rows)


def test_simulation_refuses_unknown_predictors_and_arrivals():
    from lenpred.studies.simulate import SimExperimentConfig
    from lenpred.studies.workload import check_predictors

    table = pa.table({"output_len": [1, 2], "pred_estp": [1.0, 2.0], "pred_last": [1.0, 2.0]})
    check_predictors(table, ("estp", "last"))
    with pytest.raises(LenpredError, match="no predictions of ltr: use --predictors with estp, last"):
        check_predictors(table, ("estp", "ltr"))
    with pytest.raises(LenpredError, match="--arrivals: unknown process foo"):
        SimExperimentConfig(arrivals=("all", "foo"))
    with pytest.raises(LenpredError, match="--draws must be >= 2 .*got 1"):
        SimExperimentConfig(draws=1)
    with pytest.raises(LenpredError, match="--num-requests must be >= 2, got -5"):
        SimExperimentConfig(num_requests=-5)
    with pytest.raises(LenpredError, match="--cv must be > 0 .*got -1"):
        SimExperimentConfig(cv=-1.0)


def test_parked_sjf_and_fcfs_hand_worked():
    from lenpred.serving.parked import SchedulerConfig
    from lenpred.serving.simulator import simulate_parked

    # all four prefilled in the first step (t = 1, fused: one forward per step); the 1-token request ends there.
    # One decode slot. SJF by true length then decodes r3 (1 more: t = 2), r2 (2 more: t = 4), r0 (3 more: t = 7)
    reqs = [req(i, L) for i, L in enumerate(LENGTHS)]
    cfg = SimConfig(max_num_seqs=8)
    summary, timings = simulate_parked(reqs, SchedulerConfig("sjf", decode_slots=1), unit_cost(True), cfg, "oracle")
    assert [t.jct_s for t in timings] == [7, 1, 4, 2]
    assert [t.ttft_s for t in timings] == [1, 1, 1, 1]
    assert summary["num_preemptions"] == 0
    # FCFS parking: r0 (t = 4), r2 (t = 6), r3 (t = 7)
    _, timings = simulate_parked(reqs, SchedulerConfig("fcfs", decode_slots=1), unit_cost(True), cfg, None)
    assert [t.jct_s for t in timings] == [4, 1, 6, 7]
    with pytest.raises(LenpredError, match="ranks by a prediction"):
        simulate_parked(reqs, SchedulerConfig("sjf"), unit_cost(True), cfg, None)


def test_parked_srpt_parks_a_running_request_and_sjf_does_not():
    from lenpred.serving.parked import SchedulerConfig
    from lenpred.serving.simulator import _Parked

    # r0 (10 tokens) from t = 0, r1 (2 tokens) arrives at t = 2.5. Prefill r0 → t = 1; it decodes to t = 3 (the
    # step in which r1 arrives); the step that prefills r1 also decodes r0 (t = 4; r0 4/10, r1 1/2).
    # SRPT: r1 has 1 left, r0 6 → r1 decodes (t = 5, JCT 2.5), then r0 (t = 11). SJF keeps r0: t = 10, r1 t = 11
    def jcts(policy):  # _Parked keeps the given arrival times (simulate_parked draws them from SimConfig)
        requests = [req(0, 10, arrival=0.0), req(1, 2, arrival=2.5)]
        config = SchedulerConfig(policy, decode_slots=1, max_idle_s=None, switch_margin_tokens=0)
        run = _Parked(requests, config, config.make_policy("oracle"), unit_cost(True), SimConfig(max_num_seqs=8))
        return [t.jct_s for t in run.run()[1]]

    assert jcts("srpt") == [11, 2.5]
    assert jcts("sjf") == [10, 8.5]


def test_parked_prefill_ahead_bounds_the_prefilled_pool():
    from lenpred.serving.parked import SchedulerConfig
    from lenpred.serving.simulator import simulate_parked

    # one decode slot, at most one request prefilled ahead: t = 1 prefills r0, r1 (r1's one token ends it); r0
    # decodes; t = 2 prefills r2 beside r0's decode; r0 ends at t = 4 (incumbent); t = 5 prefills r3 beside r2's
    # decode; r2 ends at t = 6, r3 at t = 7
    reqs = [req(i, L) for i, L in enumerate(LENGTHS)]
    cfg = SchedulerConfig("sjf", decode_slots=1, prefill_ahead=1)
    _, timings = simulate_parked(reqs, cfg, unit_cost(True), SimConfig(max_num_seqs=8), "oracle")
    assert [t.jct_s for t in timings] == [4, 1, 6, 7]
    assert [t.ttft_s for t in timings] == [1, 1, 2, 5]


def test_policies_are_registered_classes_and_duplicates_are_refused():
    from dataclasses import dataclass

    from lenpred.serving.policies import POLICIES, SJF, SRPT, Policy, register

    assert list(POLICIES) == ["fcfs", "random", "sjf", "srpt", "hrrn", "boost", "boost_predicted", "las"]
    assert POLICIES["sjf"] is SJF
    assert isinstance(make_policy("srpt:est"), SRPT) and make_policy("srpt:est").preemptive
    assert not make_policy("sjf:est").preemptive and make_policy("sjf:est").remaining is None
    with pytest.raises(LenpredError, match="policy name 'sjf' is already registered by SJF"):
        register("sjf")(type("Other", (Policy,), {}))
    assert POLICIES["sjf"] is SJF  # the first registration stands

    @register("lifo")
    @dataclass(frozen=True)
    class LIFO(Policy):  # a new policy is one registered class
        rank_unit = "s"

        def rank(self, view):
            return -view.arrival_time_s

    try:
        reqs = [req(0, 3), req(1, 1, arrival=1.0), req(2, 2, arrival=2.0)]
        lifo = make_policy("lifo")
        assert [r.request_id for r in sorted(reqs, key=lambda r: lifo.key(workload_view(r, lifo, 0, 0.0)))] == [2, 1, 0]
        with pytest.raises(LenpredError, match="valid policies: fcfs, random, sjf, srpt, hrrn, boost, .*, lifo"):
            make_policy("nope")
    finally:
        del POLICIES["lifo"]


def test_srpt_keys_by_remaining_and_preempts_below_c_times_prediction():
    r = req(0, 10, pred=10)
    policy, sjf = make_policy("srpt:est"), make_policy("sjf:est")
    view = lambda p, generated: workload_view(r, p, generated, 0.0)  # noqa: E731
    assert policy.key(view(policy, 4)) == (6.0, r.arrival_time_s, 0)  # countdown: 10 predicted − 4 generated
    assert policy.preemptible(view(policy, 7)) and not policy.preemptible(view(policy, 8))  # 0.8 × 10 = 8
    assert sjf.key(view(sjf, 4)) == (10.0, r.arrival_time_s, 0)  # static: generated is not read


def test_kv_cache_preempts_the_last_admitted_by_recomputation():
    # 4 blocks of 2 tokens; r0, r1: prompt 2, 4 tokens each. t=1 both prefilled (1 block each, KV 2 tokens each).
    # Two decodes fit (t=3, KV 4 tokens = 2 blocks each); the third needs 3 blocks each: FCFS preempts r1 (the last
    # admitted), r0 decodes its last token (t=4). r1 is prefilled again with its 3 tokens (5 tokens: 3 blocks, t=5)
    # and that step's token is its 4th.
    reqs = [req(0, 4, prompt=2), req(1, 4, prompt=2)]
    cfg = SimConfig(max_num_seqs=2, kv_cache_tokens=8, block_size=2)
    summary, timings = simulate(reqs, make_policy("fcfs"), unit_cost(), cfg)
    assert [t.finish_time_s for t in timings] == [4, 5]
    assert [t.num_preemptions for t in timings] == [0, 1]
    assert summary["num_preemptions"] == 1
    unbounded = simulate(reqs, make_policy("fcfs"), unit_cost(), SimConfig(max_num_seqs=2))[1]
    assert [t.finish_time_s for t in unbounded] == [4, 4]


def test_kv_cache_preempts_a_parked_request_before_a_decoder():
    # 3 blocks of 2 tokens, one decode slot: r0 (predicted 4) decodes, r1 (predicted 10) is parked holding 1 block.
    # r0's third decode needs a third block: the parked r1 is preempted, not the decoder; r0 ends at t=4, r1 is
    # prefilled again (t=5) and decodes its last 2 tokens (t=7).
    from lenpred.serving.parked import SchedulerConfig
    from lenpred.serving.simulator import simulate_parked

    reqs = [req(0, 4, pred=4, prompt=2), req(1, 4, pred=10, prompt=2)]
    cfg = SimConfig(max_num_seqs=2, kv_cache_tokens=6, block_size=2)
    _, timings = simulate_parked(reqs, SchedulerConfig("sjf", 1, None, max_idle_s=None), unit_cost(), cfg, "est")
    assert [t.finish_time_s for t in timings] == [4, 7]
    assert [t.num_preemptions for t in timings] == [0, 1]


def test_kv_cache_smaller_than_one_prompt_is_refused():
    with pytest.raises(LenpredError, match="raise kv_cache_tokens"):
        simulate([req(0, 4, prompt=9)], make_policy("fcfs"), unit_cost(),
                 SimConfig(max_num_seqs=2, kv_cache_tokens=8, block_size=2))


def test_prediction_cost_micro_batches_on_one_server():
    from lenpred.serving.simulator import PredictionCost

    # batch 1 = r0, r1 (queued at 0): 0.01 + 0.001·30 → 0.04; r2 arrives at 0.05 when the server is free: 0.05 + 0.01
    # + 0.03 = 0.09; r3 at 1.0: 1.05. With one request per batch, r1 waits for r0: 0.02, 0.02 + 0.03 = 0.05.
    cost = PredictionCost(per_batch_s=0.01, per_token_s=0.001)
    ready = cost.ready_times(np.array([0.0, 0.0, 0.05, 1.0]), np.array([10.0, 20.0, 30.0, 40.0]))
    np.testing.assert_allclose(ready, [0.04, 0.04, 0.09, 1.05])
    one = PredictionCost(per_batch_s=0.01, per_token_s=0.001, max_batch_size=1)
    np.testing.assert_allclose(one.ready_times(np.array([0.0, 0.0]), np.array([10.0, 20.0])), [0.02, 0.05])


def test_prediction_cost_delays_the_engine_but_times_count_from_the_client():
    from lenpred.serving.simulator import PredictionCost

    # one request of 4 tokens, unit cost: its prediction takes 0.5 s, so it is prefilled at 1.5 and ends at 4.5;
    # TTFT and JCT count from its arrival at 0
    _, timings = simulate([req(0, 4)], make_policy("fcfs"), unit_cost(), SimConfig(max_num_seqs=1),
                          PredictionCost(per_batch_s=0.5, per_token_s=0.0))
    assert timings[0].arrival_time_s == 0.0
    assert timings[0].ttft_s == pytest.approx(1.5)
    assert timings[0].jct_s == pytest.approx(4.5)


def test_parked_admit_by_prompt_len_prefills_the_shortest_prompt_first():
    from lenpred.serving.parked import SchedulerConfig
    from lenpred.serving.simulator import simulate_parked

    # one request at a time, one token each, unit cost: prompts 30, 10, 20 are prefilled 10, 20, 30 (t = 1, 2, 3)
    reqs = [req(0, 1, prompt=30), req(1, 1, prompt=10), req(2, 1, prompt=20)]
    finish = {}
    for order in ("arrival", "prompt_len"):
        cfg = SchedulerConfig("fcfs", decode_slots=1, prefill_ahead=0, admit_by=order)
        runs = simulate_parked(reqs, cfg, unit_cost(), SimConfig(max_num_seqs=8), None)[1]
        finish[order] = [t.finish_time_s for t in runs]
    assert finish == {"arrival": [1, 2, 3], "prompt_len": [3, 1, 2]}
    with pytest.raises(LenpredError, match="admit_by 'lifo' is unknown; valid: arrival, prompt_len"):
        SchedulerConfig("fcfs", admit_by="lifo")
