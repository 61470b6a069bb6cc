"""The plug-in's scheduler against the *installed* vLLM's internals it overrides (``schedule``,
``update_from_output``, ``_free_request``'s ``(kv, ec)`` return, ``add_request``, ``running``, ``max_num_active_reqs``,
``kv_cache_manager.block_pool``, ``_preempt_request``, ``AsyncScheduler``) and the ``SchedulerOutput`` fields the
worker reads: schedule -> update_from_output
-> finish / abort with fake ``ModelRunnerOutput``s, no weights, no engine, seconds; so that a vLLM bump that moves
them fails here, not in a benchmark. Also: both adapters' start-up checks against the installed vLLM, and a parked
policy registered in one class running in the engine by name. End to end with the model: ``test_vllm_plugin.py`` (slow);
the fake engine itself: ``fake_engine.py``."""

import pytest

pytest.importorskip("vllm")
from vllm.v1.request import FinishReason, RequestStatus  # noqa: E402 - after the skip: these need vLLM

from lenpred.errors import LenpredError  # noqa: E402
from lenpred.serving.vllm.contract import STATES_ATTR  # noqa: E402

from .fake_engine import (CHUNK, STOP, assert_clean, decoding, drain, free_blocks, make_scheduler,  # noqa: E402
                          predictions, request, step)

pytestmark = [pytest.mark.vllm]


@pytest.fixture(scope="module")
def model_dir():
    """The converted default model directory (its config.json is what check_served_model compares the head with)."""
    from lenpred.backbone import resolve_model

    return resolve_model()[0]


def test_sjf_decodes_the_shortest_prediction_until_it_finishes(model_dir):
    s, worker, free = make_scheduler(model_dir, policy="sjf", decode_slots=1, max_idle_s=None)
    caps = {"a": 300, "b": 300, "c": 300, "d": 4}  # d finishes by its cap, the others by STOP
    lens = {rid: 12 + k for k, rid in enumerate(caps)}
    for k, rid in enumerate(caps):
        s.add_request(request(rid, prompt_len=lens[rid], max_tokens=caps[rid], priority=k, first=100 + 20 * k))
    so, _ = step(s, worker)
    assert so.num_scheduled_tokens == {"a": 12, "b": 13, "c": 14, "d": 15}  # every prefill in the first step
    preds = predictions(s)
    assert sorted(preds) == list(caps) and s.lenpred_counters["predicted"] == 4
    assert {rid: r.client_priority for rid, r in s.lenpred_requests.items()} == {"a": 0, "b": 1, "c": 2, "d": 3}
    served = dict(s.lenpred_requests)
    for rid, p in preds.items():  # the head on the state the worker sent, clipped to the cap
        want = s.lenpred_predictor.predict_states(worker.sent[rid][None], [lens[rid]], [caps[rid]])[0]
        assert (p.expected, p.median) == (pytest.approx(want.expected), pytest.approx(want.median))
        assert (p.max_new_tokens, p.num_prompt_tokens) == (caps[rid], lens[rid])
    assert len({p.expected for p in preds.values()}) == 4  # distinct: the order below is the policy's
    order, finished = sorted(preds, key=lambda r: preds[r].expected), {}
    while s.requests:
        live = [r for r in order if r not in finished]
        stop = {live[0]: STOP} if live[0] != "d" and s.requests[live[0]].num_output_tokens == 2 else None
        so, done = step(s, worker, tokens=stop)
        assert so.num_scheduled_tokens == {live[0]: 1}  # one slot, to the shortest unfinished (parked: the rest)
        assert s.max_num_active_reqs == 8  # restored after the parked requests were left out
        finished.update(done)
    assert list(finished) == order
    for rid, out in finished.items():
        assert out.finish_reason == (FinishReason.LENGTH if rid == "d" else FinishReason.STOP)
        assert out.new_token_ids == [STOP] or rid == "d"
        public = out.kv_transfer_params["lenpred"]
        assert public["expected"] == round(preds[rid].expected, 1) and public["max_tokens"] == caps[rid]
        assert public["num_parked_steps"] == served[rid].num_parked_steps == sum(
            caps[r] - 1 if r == "d" else 2 for r in order[:order.index(rid)])
    assert s.lenpred_counters["parked_request_steps"] == sum(served[r].num_parked_steps for r in order)
    assert_clean(s, free)


def test_aborts_parked_mid_chunked_prefill_in_flight_and_decoding_leave_nothing(model_dir):
    aborted = RequestStatus.FINISHED_ABORTED
    s, worker, free = make_scheduler(model_dir, policy="sjf", decode_slots=1, rank_by="priority")
    s.add_request(request("short", priority=5))
    s.add_request(request("parked", priority=50, first=200))
    step(s, worker)
    assert sorted(predictions(s)) == ["parked", "short"]
    s.add_request(request("chunked", prompt_len=100, first=300))
    so, _ = step(s, worker)
    assert so.num_scheduled_tokens == {"short": 1, "chunked": CHUNK - 1}  # "parked" parked, "chunked" mid-prefill
    assert s.requests["chunked"].num_computed_tokens < 100 and "chunked" not in predictions(s)
    held = free - free_blocks(s)
    assert sorted(r.request_id for r in s.finish_requests(["parked", "chunked"], aborted)) == ["chunked", "parked"]
    assert free - free_blocks(s) == 2 < held  # only "short"'s 2 blocks (22 tokens) remain
    s.add_request(request("in-flight", first=500))
    so = s.schedule()
    assert so.num_scheduled_tokens == {"short": 1, "in-flight": 20}
    s.finish_requests("in-flight", aborted)  # before its prefill's output (and state) came back
    s.update_from_output(so, worker.run(so))
    assert "in-flight" in worker.sent and list(predictions(s)) == ["short"] and decoding(s) == {"short"}
    s.finish_requests("short", aborted)  # while decoding
    assert_clean(s, free)


def test_same_id_resubmitted_after_an_abort_is_served_and_predicted_again(model_dir):
    s, worker, free = make_scheduler(model_dir, policy="srpt", decode_slots=1, plp=False)
    s.add_request(request("x", priority=7))
    step(s, worker)
    first = predictions(s)["x"]
    s.finish_requests("x", RequestStatus.FINISHED_ABORTED)
    assert_clean(s, free)
    s.add_request(request("x", prompt_len=100, max_tokens=3, priority=9, first=700))  # another prompt, same id
    assert s.lenpred_requests["x"].client_priority == 9 and list(s.lenpred_requests) == ["x"]
    step(s, worker)  # its first chunk, in the output that also reports the aborted "x" finished
    assert "x" not in predictions(s)
    step(s, worker)  # the last chunk: the worker must still know the new "x"'s prompt length
    again = predictions(s)["x"]
    assert again is not first and (again.num_prompt_tokens, again.max_new_tokens) == (100, 3)
    assert again.expected == pytest.approx(s.lenpred_predictor.predict_states(worker.sent["x"][None], [100], [3])[0]
                                           .expected)
    done = drain(s, worker)
    assert done["x"].kv_transfer_params["lenpred"]["num_prompt_tokens"] == 100
    assert_clean(s, free)


def test_n2_siblings_share_a_prompt_and_the_prefix_cache_hit_is_predicted_alike(model_dir):
    # n > 1 never reaches the scheduler: vLLM's front end (LLMEngine / AsyncLLM via ParentRequest) fans it out into
    # child requests with their own ids ("0_<id>", "1_<id>", ...) that share the prompt; so two requests here.
    s, worker, free = make_scheduler(model_dir, prefix_caching=True, policy="sjf", decode_slots=2)
    for rid in ("0_p", "1_p"):
        s.add_request(request(rid, prompt_len=40, max_tokens=3, first=900, hashed=True))
    so, _ = step(s, worker)
    assert so.num_scheduled_tokens == {"0_p": 40, "1_p": 8}  # the second hits the first's two full blocks
    assert [new.num_computed_tokens for new in so.scheduled_new_reqs] == [0, 32]
    siblings = [predictions(s)[r].expected for r in ("0_p", "1_p")]
    assert siblings[0] == siblings[1]  # one prompt, one state, one prediction
    done = drain(s, worker)
    assert sorted(done) == ["0_p", "1_p"]
    assert {o.kv_transfer_params["lenpred"]["expected"] for o in done.values()} == {round(siblings[0], 1)}
    assert_clean(s, free)


def test_parked_requests_count_against_admission(model_dir):
    s, worker, _ = make_scheduler(model_dir, policy="sjf", decode_slots=1, prefill_ahead=1, rank_by="priority")
    for k, rid in enumerate("abcd"):
        s.add_request(request(rid, priority=10 + k, first=100 + 30 * k))
    so, _ = step(s, worker)
    assert sorted(so.num_scheduled_tokens) == ["a", "b"]  # decode_slots + prefill_ahead admitted
    so, _ = step(s, worker)
    assert so.num_scheduled_tokens == {"a": 1} and len(s.waiting) == 2  # "b" parked holds the second place
    assert s.max_num_active_reqs == 8 and [r.request_id for r in s.running] == ["a", "b"]
    so, _ = step(s, worker, tokens={"a": STOP})
    so, _ = step(s, worker)
    assert so.num_scheduled_tokens == {"b": 1, "c": 20}  # "a" finished: "c" takes its place


def test_admit_by_prompt_len_prefills_the_shortest_prompts_first(model_dir):
    # one request at a time (one decode slot, nothing prefilled ahead): prompts a 24, b 12, c 16, d 8 tokens, each
    # stopping at its first token, are prefilled shortest first (d, b, c, a) whatever their arrival; the client's own
    # priority is kept for rank_by priority
    s, worker, _ = make_scheduler(model_dir, scheduling_policy="priority", policy="sjf", decode_slots=1,
                                  prefill_ahead=0, admit_by="prompt_len")
    for k, (rid, n) in enumerate(zip("abcd", (24, 12, 16, 8))):
        s.add_request(request(rid, prompt_len=n, priority=7, first=100 + 50 * k))
    assert {rid: r.client_priority for rid, r in s.lenpred_requests.items()} == {"a": 7, "b": 7, "c": 7, "d": 7}
    order = [step(s, worker, tokens={r: STOP for r in "abcd"})[0].num_scheduled_tokens for _ in range(4)]
    assert order == [{"d": 8}, {"b": 12}, {"c": 16}, {"a": 24}]
    with pytest.raises(LenpredError, match="start vLLM with --scheduling-policy priority"):
        make_scheduler(model_dir, policy="sjf", admit_by="prompt_len")
    with pytest.raises(LenpredError, match="start vLLM with --scheduling-policy priority"):  # the default design
        make_scheduler(model_dir, admit_by="prompt_len")


def test_the_age_threshold_admits_the_overdue_first_in_arrival_order(model_dir):
    # as above, prompts a 24, b 12, c 16, d 8 tokens; a and c then fall overdue (120 s threshold; their arrival moved
    # 200 s and 150 s back, as if they had waited): the plug-in re-ranks them in vLLM's waiting heap at the next
    # step, so a and c are prefilled first in arrival order, then the shortest prompts
    import time

    s, worker, _ = make_scheduler(model_dir, scheduling_policy="priority", policy="sjf", decode_slots=1,
                                  prefill_ahead=0, admit_by="prompt_len", max_wait_s=120.0)
    for k, (rid, n) in enumerate(zip("abcd", (24, 12, 16, 8))):
        s.add_request(request(rid, prompt_len=n, priority=7, first=100 + 50 * k))
    assert [r.priority for r in s.requests.values()] == [24, 12, 16, 8]  # none overdue yet: the prompt lengths
    now = time.time()
    s.requests["a"].arrival_time, s.requests["c"].arrival_time = now - 200, now - 150
    order = [step(s, worker, tokens={r: STOP for r in "abcd"})[0].num_scheduled_tokens for _ in range(4)]
    assert order == [{"a": 24}, {"c": 16}, {"d": 8}, {"b": 12}]


def test_an_overdue_parked_request_takes_the_decode_slot_until_it_finishes(model_dir):
    # SRPT on the client's priority, one decode slot: b (priority 5) decodes, a (50) is parked; once a falls overdue
    # (120 s threshold, its arrival moved 300 s back) it decodes every step, b parked, until it finishes; then b
    import time

    s, worker, free = make_scheduler(model_dir, policy="srpt", decode_slots=1, rank_by="priority", max_wait_s=120.0)
    s.add_request(request("a", priority=50))
    s.add_request(request("b", priority=5, first=300))
    step(s, worker)  # both prefilled
    assert step(s, worker)[0].num_scheduled_tokens == {"b": 1}
    s.requests["a"].arrival_time = time.time() - 300
    for _ in range(3):
        assert step(s, worker)[0].num_scheduled_tokens == {"a": 1}
    so, done = step(s, worker, tokens={"a": STOP})
    assert so.num_scheduled_tokens == {"a": 1} and list(done) == ["a"]
    assert step(s, worker)[0].num_scheduled_tokens == {"b": 1}
    assert s.lenpred_counters["promoted"] == 4
    drain(s, worker)
    assert_clean(s, free)


def test_observe_schedules_as_stock_vllm(model_dir):
    s, worker, free = make_scheduler(model_dir, policy="observe", decode_slots=1)
    for k, rid in enumerate("abc"):
        s.add_request(request(rid, max_tokens=3, first=100 + 30 * k))
    step(s, worker)
    assert sorted(predictions(s)) == ["a", "b", "c"]
    so, _ = step(s, worker)
    assert so.num_scheduled_tokens == {"a": 1, "b": 1, "c": 1}  # every one decodes: decode_slots is not applied
    so, done = step(s, worker)
    assert sorted(done) == ["a", "b", "c"] and all("lenpred" in o.kv_transfer_params for o in done.values())
    assert s.lenpred_counters["parked_request_steps"] == s.lenpred_counters["policy_s"] == 0  # no policy ran
    assert_clean(s, free)


def test_a_lost_state_is_counted_logged_and_served_unpredicted_as_an_sjf_incumbent(model_dir, caplog):
    s, worker, free = make_scheduler(model_dir, policy="sjf", decode_slots=1)
    s.add_request(request("lost"))
    s.add_request(request("b", first=300))
    with caplog.at_level("ERROR", logger="vllm.lenpred.scheduler"):
        step(s, worker, lose_states=("lost",))
    assert list(predictions(s)) == ["b"] and s.lenpred_counters["missing_states"] == 1
    assert s.lenpred_requests["lost"].prefilled  # the starvation guard's clock runs for it too
    logged = [r.getMessage() for r in caplog.records if r.name == "vllm.lenpred.scheduler"]
    assert logged == ["lenpred: request lost ended its prefill without a captured state: no prediction "
                      "(on_missing_state=unpredicted)"]
    assert s._lenpred_view(s.requests["lost"], 0.0).predicted_total == float("inf")
    so, _ = step(s, worker, tokens={"b": STOP})
    assert so.num_scheduled_tokens == {"b": 1}  # ranked after the predicted request
    so, _ = step(s, worker)
    assert so.num_scheduled_tokens == {"lost": 1} and decoding(s) == {"lost"}
    s.add_request(request("c", first=500))
    step(s, worker)  # "c" prefilled and predicted while "lost" decodes
    so, done = step(s, worker, tokens={"lost": STOP})
    assert so.num_scheduled_tokens == {"lost": 1}  # sjf: the incumbent keeps its slot, predicted or not
    assert done["lost"].finish_reason == FinishReason.STOP and done["lost"].kv_transfer_params is None
    so, done = step(s, worker, tokens={"c": STOP})
    assert so.num_scheduled_tokens == {"c": 1} and list(done) == ["c"]
    assert s.lenpred_counters["missing_states"] == 1  # counted once, not per step
    assert_clean(s, free)


def test_a_lost_state_is_refused_with_an_error_when_configured(model_dir):
    s, worker, free = make_scheduler(model_dir, policy="sjf", decode_slots=1, on_missing_state="refuse")
    s.add_request(request("lost"))
    s.add_request(request("b", first=300))
    _, done = step(s, worker, lose_states=("lost",))
    assert list(done) == ["lost"] and done["lost"].finish_reason == FinishReason.ERROR
    assert "lost" not in s.requests and s.lenpred_counters["missing_states"] == 1
    _, done = step(s, worker, tokens={"b": STOP})
    assert list(done) == ["b"] and done["b"].kv_transfer_params["lenpred"]["num_prompt_tokens"] == 20
    assert_clean(s, free)


def test_async_scheduling_stays_on_under_the_plugin_and_orders_alike(model_dir):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    s, worker, free = make_scheduler(model_dir, async_scheduling=True, policy="sjf", decode_slots=1,
                                     rank_by="priority", max_idle_s=None)
    assert isinstance(s, AsyncScheduler) and type(s).__name__ == "LenpredAsyncScheduler"
    for k, (rid, prio) in enumerate((("a", 30), ("b", 10), ("c", 20))):
        s.add_request(request(rid, max_tokens=3, priority=prio, first=100 + 30 * k))
    assert list(drain(s, worker)) == ["b", "c", "a"]
    assert s.lenpred_counters["predicted"] == 3
    assert_clean(s, free)


def test_kv_pressure_preempts_parked_requests_not_the_decoder_and_everything_finishes(model_dir):
    # 12 usable blocks; 6 requests of 40 prompt tokens (3 blocks) that grow to 70 tokens (5 blocks) each
    s, worker, free = make_scheduler(model_dir, num_blocks=13, policy="sjf", decode_slots=1, rank_by="priority",
                                     max_idle_s=None)
    for k in range(6):
        s.add_request(request(f"r{k}", prompt_len=40, max_tokens=30, priority=10 * (k + 1), first=100 + 50 * k))
    done = {}
    for _ in range(2000):
        if not s.requests:
            break
        done.update(step(s, worker)[1])
    assert list(done) == [f"r{k}" for k in range(6)]  # shortest first, and every one finishes
    c = s.lenpred_counters
    assert c["kv_preempted"] >= 1 and c["recomputed_tokens"] >= 40 * c["kv_preempted"]
    assert_clean(s, free)


def test_a_policy_registered_in_one_class_runs_in_the_engine_by_name(model_dir, caplog):
    from dataclasses import dataclass

    from lenpred.serving.policies import POLICIES, Policy, register

    @register("lpt")
    @dataclass(frozen=True)
    class LongestFirst(Policy):  # longest predicted first, non-preemptive: one class, nothing else
        reads_prediction = True

        def rank(self, view):
            return -view.predicted_total

    try:
        with caplog.at_level("WARNING", logger="vllm.lenpred.scheduler"):
            s, worker, free = make_scheduler(model_dir, policy="lpt", decode_slots=1, rank_by="priority",
                                             max_idle_s=None)
        assert not [r for r in caplog.records if r.name == "vllm.lenpred.scheduler"]  # vLLM 0.32.0: no warning
        assert s._lp_policy == LongestFirst(max_idle_s=None) and s._lp_plp is None
        for k, (rid, prio) in enumerate((("a", 30), ("b", 10), ("c", 20))):
            s.add_request(request(rid, max_tokens=3, priority=prio, first=100 + 30 * k))
        so, _ = step(s, worker)
        assert so.num_scheduled_tokens == {"a": 20, "b": 20, "c": 20}  # every prefill at once
        so, _ = step(s, worker)
        assert so.num_scheduled_tokens == {"a": 1}  # the longest (30) decodes, the others are parked
        assert list(drain(s, worker)) == ["a", "c", "b"]  # longest first (sjf: b, c, a; fcfs: a, b, c)
        assert s.lenpred_counters["parked_request_steps"] == 2 + 2 + 1 + 1  # b, c while a decodes 2; b while c 2
        assert_clean(s, free)
    finally:
        del POLICIES["lpt"]


def test_another_vllm_version_is_warned_about_and_a_missing_internal_refused_by_name(model_dir, caplog, monkeypatch):
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler

    from lenpred.errors import LenpredError

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    with caplog.at_level("WARNING", logger="vllm.lenpred.scheduler"):
        make_scheduler(model_dir, policy="sjf")
    assert [r.getMessage() for r in caplog.records if r.name == "vllm.lenpred.scheduler"] == [
        "lenpred: the lenpred scheduler was written for vLLM 0.32.0, and vLLM 0.33.0 is installed: it relies on "
        "non-public vLLM internals, so check its results (tests/serving/vllm/test_vllm_contract.py) or install vLLM 0.32.0"]
    monkeypatch.delattr(Scheduler, "_preempt_request")
    with pytest.raises(LenpredError, match=r"^vLLM's Scheduler class in vLLM 0.33.0 has no '_preempt_request', which "
                                           r"the lenpred plug-in \(written for vLLM 0.32.0\) needs"):
        make_scheduler(model_dir, policy="sjf")


def test_the_worker_adapter_finds_what_it_reads_in_the_installed_vllm(caplog):
    from types import SimpleNamespace

    from lenpred.errors import LenpredError
    from lenpred.serving.vllm.worker import LenpredCPUWorker, check_vllm

    worker = object.__new__(LenpredCPUWorker)  # no __init__: only what check_vllm reads
    worker.model_runner = SimpleNamespace(get_model=lambda: None)
    with caplog.at_level("WARNING", logger="vllm.lenpred.worker"):
        check_vllm(worker)  # forward context, SchedulerOutput / NewRequestData / CachedRequestData, CPUWorker
    assert not [r for r in caplog.records if r.name == "vllm.lenpred.worker"]
    worker.model_runner = SimpleNamespace()
    with pytest.raises(LenpredError, match=r"^vLLM's worker in vLLM 0.32.0 has no 'model_runner.get_model'"):
        check_vllm(worker)


def test_a_state_for_a_finished_request_still_held_gets_no_prediction(model_dir):
    """A KV connector defers freeing a finished request's blocks (and async scheduling delivers a step's states after
    an abort), so it can stay in ``requests`` after ``_free_request``; a state that arrives for it then must not
    create a prediction entry nothing would remove."""
    s, worker, _ = make_scheduler(model_dir, policy="sjf", decode_slots=1)
    s.add_request(request("a"))
    s.add_request(request("b", first=200))
    so = s.schedule()
    out = worker.run(so)
    s.requests["a"].status = RequestStatus.FINISHED_ABORTED  # finished, blocks not yet freed
    s._lenpred_apply(getattr(out, STATES_ATTR))
    assert sorted(predictions(s)) == ["b"] and s.lenpred_counters["predicted"] == 1
