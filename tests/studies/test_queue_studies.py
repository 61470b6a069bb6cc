"""The queue studies' configs and the one call site of the parked decoder's settings
(:mod:`lenpred.studies.queue_bench`, :mod:`lenpred.studies.queue_sim`, :mod:`lenpred.studies.parked_sim`), without an
engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lenpred.errors import LenpredError
from lenpred.studies.parked_sim import ParkedSimConfig
from lenpred.studies.queue_bench import QueueBenchConfig
from lenpred.studies.queue_sim import QueueSimConfig, modes, run_parked

ROOT = Path(__file__).resolve().parents[2]


def test_configs_refuse_bad_settings():
    assert QueueBenchConfig().modes.split(",")[0] == "stock"
    with pytest.raises(LenpredError, match="unknown arrival pattern"):
        QueueBenchConfig(patterns="poisson")
    with pytest.raises(LenpredError, match="unknown mode"):
        QueueBenchConfig(modes="stock,fifo")
    with pytest.raises(LenpredError, match="--capacity-req-s must be > 0"):
        QueueBenchConfig(capacity_req_s=0.0)
    assert QueueSimConfig(aging=(4, 4.0, 1)).aging == (4.0, 1.0)  # repeats dropped, floats
    with pytest.raises(LenpredError):
        QueueSimConfig(aging=(-1.0,))
    with pytest.raises(LenpredError, match="streaming overhead"):
        QueueSimConfig(streaming_overhead_ms=1e3)
    with pytest.raises(LenpredError, match="max_tokens must be >= 1"):
        ParkedSimConfig(max_tokens=0)


def test_mode_names():
    names = modes(16, (16, 32), aging=(4.0,))
    assert names[:6] == ["stock", "priority:prompt_len", "priority:oracle", "priority:prompt_oracle", "priority:last",
                         "priority:proxy"]
    assert "plugin:sjf:Wall" in names and names[-1] == "plugin:srpt:W16:prompt_len@4"
    gammas = modes(16, (16, 32), gammas=(0.01, 0.5), only=("plugin:boost",))
    assert gammas[4:] == ["plugin:boost_predicted:W16:prompt_len:g0.01", "plugin:boost_predicted:W16:prompt_len:g0.5"]
    with pytest.raises(LenpredError, match="boost gammas must be > 0"):
        QueueSimConfig(boost_gammas=(0.0,))
    assert modes(16, (16, 32), waits=(200.0, 0.5), only=("plugin:srpt:W16:prompt_len:",)) == [
        "stock", "priority:prompt_len", "priority:oracle", "priority:prompt_oracle",
        "plugin:srpt:W16:prompt_len:w200", "plugin:srpt:W16:prompt_len:w0.5"]
    assert QueueSimConfig(max_waits=(200, 200.0, 0)).max_waits == (200.0, 0.0)
    assert [f"w{w:g}" for w in QueueSimConfig(max_waits=(-0.0,)).max_waits] == ["w0"]  # not 'w-0'
    with pytest.raises(LenpredError, match="max waits must be >= 0"):
        QueueSimConfig(max_waits=(-1.0,))


def one_slot(requests: tuple) -> Callable[[str], list]:
    """``run(mode) -> timings by request id`` of the study's modes with one decode slot on the committed cost model,
    for requests given as ``(output tokens, arrival s)`` (20-token prompts, the shipped head's prediction exact)."""
    from lenpred.serving.cost_model import CostModel
    from lenpred.serving.simulator import SimConfig
    from lenpred.studies.queue_sim import run_mode
    from lenpred.studies.workload import WorkloadRequest

    reqs = [WorkloadRequest(i, [], n, 256, "rl", f"p{i}", {"last": float(n)}, num_prompt_tokens=20,
                            arrival_time_s=t) for i, (n, t) in enumerate(requests)]
    cost = CostModel.load(ROOT / "results/scripts/serving/cost_vllm_1core_sampled.json")
    base = SimConfig(max_num_seqs=1, arrival="given")
    return lambda mode: sorted(run_mode(mode, reqs, cost, base, None), key=lambda t: t.request_id)


def finish_order(timings: list) -> list[int]:
    return [t.request_id for t in sorted(timings, key=lambda t: t.finish_time_s)]


def test_boost_on_the_prediction_runs_from_shortest_first_to_fcfs_as_gamma_grows():
    # one decode slot, non-preemptive: request 0 (40 tokens) starts at once; 1 (200 tokens) and then 2 (10) arrive
    # while it decodes and wait parked
    run = one_slot(((40, 0.0), (200, 0.01), (10, 0.02)))
    # γ large: every boost ~ 0, the boosted arrival is the arrival (FCFS);
    # γ small: b_γ(w) ~ ln(1/(γw))/γ orders by the work w
    fcfs = finish_order(run("plugin:fcfs:W2:prompt_len"))
    assert finish_order(run("plugin:boost_predicted:W2:prompt_len:g1000")) == fcfs == [0, 1, 2]
    assert finish_order(run("plugin:boost_predicted:W2:prompt_len:g1e-6")) == [0, 2, 1]


def test_the_age_threshold_runs_from_fcfs_at_0_s_to_the_unguarded_plugin():
    # one decode slot, SRPT: request 0 (200 tokens) starts at once, 1 (10 tokens) arrives while it decodes and
    # takes the slot; 2 (40) arrives next and waits for 1
    run = one_slot(((200, 0.0), (10, 0.5), (40, 0.6)))

    def jct(mode):
        return [round(t.jct_s, 9) for t in run(mode)]

    # 0 s: every request is overdue on arrival, so arrival order: FCFS; a threshold no request reaches: plain SRPT
    assert jct("plugin:srpt:W2:prompt_len:w0") == jct("plugin:fcfs:W2:prompt_len")
    assert finish_order(run("plugin:srpt:W2:prompt_len:w0")) == [0, 1, 2]
    assert jct("plugin:srpt:W2:prompt_len:w1e9") == jct("plugin:srpt:W2:prompt_len")
    assert finish_order(run("plugin:srpt:W2:prompt_len")) == [1, 2, 0]
    # 1.5 s: 1 finishes first (at 1.39 s), 2 starts, and at 1.5 s request 0 falls overdue and takes the slot from 2
    # (the simulator re-ranks at that moment, as the plug-in does every step); at 1 s it takes it from 1 instead
    assert finish_order(run("plugin:srpt:W2:prompt_len:w1.5")) == [1, 0, 2]
    assert jct("plugin:srpt:W2:prompt_len:w1.5")[1] == jct("plugin:srpt:W2:prompt_len")[1]
    assert finish_order(run("plugin:srpt:W2:prompt_len:w1")) == [0, 1, 2]
    assert jct("plugin:srpt:W2:prompt_len:w1") != jct("plugin:fcfs:W2:prompt_len")


def test_each_plugin_server_logs_its_traffic_to_its_own_directory(tmp_path):
    """One traffic log per (draw, mode), so `lenpred whatif --traffic` replays exactly one server's requests."""
    from lenpred.studies.queue_bench import traffic_dir

    assert traffic_dir(tmp_path, {"mode": "stock", "plugin": None}, 2) is None
    assert traffic_dir(tmp_path, {"mode": "plugin", "plugin": {"policy": "srpt"}}, 2) == tmp_path / "traffic" / "2-plugin"
    assert traffic_dir(tmp_path, {"mode": "plugin_plp", "plugin": {"traffic_log": "/logs"}}, 0) == Path(
        "/logs/0-plugin_plp")


def test_run_parked_names_every_setting():
    from lenpred.serving.cost_model import CostModel
    from lenpred.serving.parked import SchedulerConfig
    from lenpred.serving.simulator import SimConfig, simulate_parked
    from lenpred.studies.workload import WorkloadRequest

    reqs = [WorkloadRequest(i, [], n, 64, "rl", f"p{i}", {"last": float(n)}, num_prompt_tokens=20)
            for i, n in enumerate((30, 5, 12))]
    cost = CostModel.load(ROOT / "results/scripts/serving/cost_vllm_1core_sampled.json")
    cfg = SimConfig(max_num_seqs=3)
    got = run_parked(reqs, cost, cfg, policy="sjf", predictor="last", decode_slots=1, max_idle_s=None,
                     prefill_ahead=2, admit_by="prompt_len")
    want = simulate_parked(reqs, SchedulerConfig("sjf", 1, 2, "prompt_len", None, 16.0, 0.0), cost, cfg, "last")
    assert got[0] == want[0]
    assert [t.jct_s for t in got[1]] == [t.jct_s for t in want[1]]
    # one decode slot, shortest prediction first: 5, then 12, then 30 tokens
    order = sorted(got[1], key=lambda t: t.jct_s)
    assert [t.request_id for t in order] == [1, 2, 0]


def test_the_simulator_study_refuses_bad_settings_before_it_runs(tmp_path, monkeypatch):
    from lenpred.errors import LenpredError
    from lenpred.studies.queue_sim import QueueSimConfig

    for bad, msg in (({"free_policies": ("nope",)}, "unknown policy or trace nope"),
                     ({"free_policies": ("srpt",)}, "those plug-in modes always run"),
                     ({"decode_bounds": "16,0"}, "--decode-bounds takes integers >= 1"),
                     ({"traces": ("code",)}, "not found: put the Azure LLM inference trace 2023 there")):
        monkeypatch.setenv("LENPRED_TRACE_DIR", str(tmp_path))  # an empty directory: the trace fails at once
        with pytest.raises(LenpredError, match=msg):
            QueueSimConfig(**bad)


def test_only_draws_runs_one_slice_and_leaves_the_rest(tmp_path):
    from contextlib import nullcontext

    from lenpred.studies.engine_bench import run_grid

    assert QueueBenchConfig(draws=5, only_draws="4,2").draw_list() == [4, 2]
    assert QueueBenchConfig(draws=5).draw_list() is None
    with pytest.raises(LenpredError, match=r"--only-draws \[5\] outside 0..4"):
        QueueBenchConfig(draws=5, only_draws="5")
    with pytest.raises(LenpredError, match="comma-separated draw numbers"):
        QueueBenchConfig(only_draws="last")

    class Spec:  # a server group that starts nothing
        url = "http://127.0.0.1:0"

        def start(self):
            return nullcontext()

    store, ran = {"runs": {"0/a/p": {}}}, []
    run_grid(store, tmp_path / "runs.json", 3, ["a", "b"], ["a", "b"], ["p"], lambda d, m: Spec(),
             lambda d, m, url: None, lambda d, m, p, url: ran.append((d, m)) or {}, lambda rec: "",
             only_draws=[2, 0])
    # draw 1 left for later, draw 0's stored run not redone, draw 2's modes in all_modes rotated by 2 (a, b)
    assert ran == [(0, "b"), (2, "a"), (2, "b")]
    assert sorted(store["runs"]) == ["0/a/p", "0/b/p", "2/a/p", "2/b/p"]
