"""The plug-in's scheduler against the *installed* vLLM, without a model or an engine: ``LenpredScheduler`` driven
through schedule -> update_from_output -> finish / abort with fake model-runner outputs, so that a vLLM release that
moves what it overrides (``schedule``, ``update_from_output``, ``_free_request`` and its tuple return,
``add_request``, ``running``, ``max_num_active_reqs``, the block pool, ``_preempt_request``) fails here in seconds.

Each case ends with the KV pool back at its start and every side table empty. Runs in ``.venv-vllm`` (``pytest -m
vllm``); needs the converted default model's config and tokenizer (no weights are read)."""

import os

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

BLOCK = 16


def make_scheduler(num_blocks=64, async_scheduling=False, **lenpred):
    """A ``LenpredScheduler`` over a fake KV pool of ``num_blocks`` blocks of 16 tokens; ``lenpred``: EngineConfig
    settings (default: parked SJF by the request's ``priority``, one decode slot)."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from lenpred.backbone import resolve_model
    from lenpred.serving.vllm.scheduler import LenpredScheduler

    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    settings = {"policy": "sjf", "decode_slots": 1, "rank_by": "priority", "max_idle_s": None, **lenpred}
    vc = VllmConfig(model_config=ModelConfig(model=str(resolve_model()[0]), dtype="float32", enforce_eager=True,
                                             max_model_len=512, seed=0),
                    scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=512,
                                                     enable_chunked_prefill=False, is_encoder_decoder=False,
                                                     async_scheduling=async_scheduling),
                    cache_config=CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=False),
                    additional_config={"lenpred": settings})
    vc.cache_config.num_gpu_blocks = num_blocks
    vc.scheduler_config.async_scheduling = async_scheduling  # vllm-cpu's platform hook forces it off; GPUs keep it
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    return LenpredScheduler(vllm_config=vc, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(vc),
                            block_size=BLOCK, log_stats=True)


def add(s, rid, priority, prompt_tokens=20, max_tokens=4):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    s.add_request(Request(rid, list(range(1, prompt_tokens + 1)), SamplingParams(max_tokens=max_tokens,
                                                                                 ignore_eos=True), None,
                          priority=priority))


def step(s, with_states=True, drop=()):
    """One engine step: schedule, then a fake output (token 7 for every scheduled request; the worker's states for
    the requests whose prefill ran, unless ``with_states`` is off). Returns (scheduled ids, finished outputs)."""
    from vllm.v1.outputs import ModelRunnerOutput

    from lenpred.serving.vllm.worker import STATES_ATTR

    out = s.schedule()
    ids = [rid for rid in out.num_scheduled_tokens if rid not in drop]
    mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                            sampled_token_ids=[[7] for _ in ids])
    prefilled = [r.req_id for r in out.scheduled_new_reqs] + sorted(out.scheduled_cached_reqs.resumed_req_ids)
    if with_states:
        layer, width = s.lenpred_predictor.engine_layer, len(s.lenpred_predictor.predictor_.head_.mean_)
        rng = np.random.default_rng(len(s.lenpred_counters) + s.lenpred_counters["steps"])
        setattr(mro, STATES_ATTR, {rid: {"step": 0, "states": {layer: rng.normal(0, 1, width).astype(np.float32)}}
                                   for rid in prefilled if rid in ids})
    engine_outputs = s.update_from_output(out, mro)
    finished = [o for outs in engine_outputs.values() for o in outs.outputs if o.finish_reason is not None]
    return list(out.num_scheduled_tokens), finished


def assert_clean(s, free_at_start):
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == free_at_start
    assert not s.requests and not s.running and not len(s.waiting)
    assert not s.lenpred_predictions and not s._lp_decoding and not s._lp_last_decode
    assert not s._lp_client_priority and not s._lp_missing


def run_to_end(s, max_steps=200):
    order = []
    for _ in range(max_steps):
        if not s.requests:
            return order
        order += [o.request_id for o in step(s)[1]]
    raise AssertionError(f"not finished after {max_steps} steps: {list(s.requests)}")


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_parked_sjf_decodes_the_shortest_first_and_frees_everything(async_scheduling):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    s = make_scheduler(async_scheduling=async_scheduling)
    assert isinstance(s, AsyncScheduler) == async_scheduling  # async scheduling stays on under the plug-in
    free = s.kv_cache_manager.block_pool.get_num_free_blocks()
    for rid, prio in (("a", 30), ("b", 10), ("c", 20)):
        add(s, rid, prio)
    scheduled, _ = step(s)
    assert sorted(scheduled) == ["a", "b", "c"]  # every request prefilled on arrival
    assert set(s.lenpred_predictions) == {"a", "b", "c"} and s.lenpred_counters["predicted"] == 3
    scheduled, _ = step(s)
    assert scheduled == ["b"]  # one slot, the shortest priority
    finished = []
    for _ in range(50):
        scheduled, done = step(s)
        finished += done
        if not s.requests:
            break
    assert [o.request_id for o in finished] == ["b", "c", "a"]
    public = finished[0].kv_transfer_params["lenpred"]
    assert public["max_tokens"] == 4 and public["num_prompt_tokens"] == 20 and public["expected"] >= 0
    assert s.lenpred_counters["parked_request_steps"] > 0 and s.lenpred_counters["missing_states"] == 0
    assert_clean(s, free)


def test_observe_is_stock_scheduling():
    s = make_scheduler(policy="observe")
    for rid, prio in (("a", 30), ("b", 10)):
        add(s, rid, prio)
    step(s)
    assert sorted(step(s)[0]) == ["a", "b"]  # both decode: nothing parked
    assert set(s.lenpred_predictions) == {"a", "b"}


def test_aborts_while_parked_during_prefill_and_decoding_free_blocks_once():
    from vllm.v1.request import RequestStatus

    s = make_scheduler()
    free = s.kv_cache_manager.block_pool.get_num_free_blocks()
    for rid, prio in (("long", 300), ("short", 10)):
        add(s, rid, prio, max_tokens=50)
    step(s)
    assert step(s)[0] == ["short"]  # "long" is parked
    s.finish_requests("long", RequestStatus.FINISHED_ABORTED)  # abort while parked
    add(s, "late", 5)
    out = s.schedule()  # "late" is being prefilled ...
    assert "late" in out.num_scheduled_tokens
    s.finish_requests("late", RequestStatus.FINISHED_ABORTED)  # ... and aborted before its output returns
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                sampled_token_ids=[[7] for _ in ids]))
    s.finish_requests("short", RequestStatus.FINISHED_ABORTED)  # abort while decoding
    step(s)  # the aborted ids reach the worker in the next scheduler output
    assert_clean(s, free)
    add(s, "short", 10, max_tokens=3)  # the same id right after its abort: served and predicted again
    assert run_to_end(s) == ["short"]
    assert_clean(s, free)


def test_two_samples_of_one_prompt_are_two_requests():
    # n > 1 is fanned out above the scheduler (vLLM's parallel-sampling parent request makes one child request per
    # sample, each with its own id): here, two requests with the same prompt.
    s = make_scheduler(decode_slots=2)
    free = s.kv_cache_manager.block_pool.get_num_free_blocks()
    add(s, "0_parent", 10, max_tokens=3)
    add(s, "1_parent", 10, max_tokens=5)
    assert sorted(run_to_end(s)) == ["0_parent", "1_parent"]
    assert_clean(s, free)


def test_a_prefill_without_its_state_is_counted_not_silently_ranked_last(caplog):
    s = make_scheduler()
    add(s, "a", 10)
    with caplog.at_level("ERROR"):
        step(s, with_states=False)
    assert s.lenpred_counters["missing_states"] == 1 and "a" not in s.lenpred_predictions
    assert any("without a captured state" in r.getMessage() for r in caplog.records)
    step(s, with_states=False)
    assert s.lenpred_counters["missing_states"] == 1  # counted once per request
    run_to_end(s)
    assert not s._lp_missing


def test_kv_pressure_preempts_parked_requests_not_the_decoder_and_everything_finishes():
    # 12 usable blocks; 6 requests of 40 prompt tokens (3 blocks each) growing to 40 + 30 tokens (5 blocks each)
    s = make_scheduler(num_blocks=13, decode_slots=1)
    free = s.kv_cache_manager.block_pool.get_num_free_blocks()
    for k in range(6):
        add(s, f"r{k}", 10 * (k + 1), prompt_tokens=40, max_tokens=30)
    order = run_to_end(s, max_steps=2000)
    assert sorted(order) == [f"r{k}" for k in range(6)]
    c = s.lenpred_counters
    assert c["kv_preempted"] >= 1 and c["recomputed_tokens"] >= 40 * c["kv_preempted"]
    assert order[0] == "r0"  # the shortest was never the victim
    assert_clean(s, free)
