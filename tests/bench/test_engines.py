"""Both sampling engines follow one set of rules (issue 11): the stop tokens of the template, the one length
rule, no silent model generation defaults, and (vLLM) memory / thread options with one-line start-up errors.

The transformers engine runs on the tiny in-memory Llama; vLLM is not installed here, so its tests replace the
``vllm`` import with a fake module that records what the engine passes and returns canned completions.
"""

from __future__ import annotations

import importlib.machinery
import json
import shutil
import sys
import types
from types import SimpleNamespace

import pytest

from lenpred.engines import SampleRequest, SampleResult, VLLMOptions, check_requests, cut_at_stop, make_engine
from lenpred.errors import LenpredError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = (2, 4, 7, 8, 3, 2, 5)  # "<s> user hello world </s> <s> assistant" in the tiny vocabulary


@pytest.fixture()
def hf_engine(tiny_model_dir, tiny_backbone):
    from lenpred.backbone import eos_token_ids

    return make_engine("transformers", str(tiny_model_dir), eos_token_ids(tiny_model_dir, tiny_backbone.tokenizer))


# ================================================================ stop tokens (item 3)


def test_stop_ids_are_every_control_token_of_the_template(tiny_model_dir, tiny_backbone):
    from lenpred.backbone import eos_token_ids

    # <unk> 0, <pad> 1, <s> 2 (turn start, written by the template), </s> 3 (turn end / EOS)
    assert eos_token_ids(tiny_model_dir, tiny_backbone.tokenizer) == (0, 1, 2, 3)


@pytest.mark.slow
def test_smollm2_stops_at_im_end_endoftext_and_im_start():
    from transformers import AutoTokenizer

    from lenpred.backbone import DEFAULT_MODEL, eos_token_ids, resolve_model

    model_dir, _ = resolve_model(DEFAULT_MODEL)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = eos_token_ids(model_dir, tok)
    assert set(tok.convert_ids_to_tokens(list(ids))) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}


def test_cut_at_stop_records_which_token_stopped():
    assert cut_at_stop([7, 8, 1, 9, 3], (0, 1, 2, 3)) == SampleResult((7, 8), "stop", 1)
    assert cut_at_stop([7, 3], (3,)) == SampleResult((7,), "stop", 3)
    assert cut_at_stop([7, 8], (3,)) == SampleResult((7, 8), "length", None)
    assert cut_at_stop([], (3,)) == SampleResult((), "length", None)


def test_transformers_engine_stops_at_a_new_turn_start(tiny_model_dir, tiny_backbone):
    """A model that wants to open a new turn (<s>, id 2) after two tokens stops there; the old EOS-only rule ran on."""
    import torch
    from transformers import AutoModelForCausalLM

    from lenpred.backbone import eos_token_ids

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    steps = []

    def push_turn_start(module, args, logits):  # the third generated token is forced to <s>
        steps.append(1)
        if len(steps) == 3:
            logits = logits.clone()
            logits[..., -1, 2] = 1e4
        return logits

    model.lm_head.register_forward_hook(push_turn_start)
    engine = make_engine("transformers", str(tiny_model_dir), eos_token_ids(tiny_model_dir, tiny_backbone.tokenizer),
                         model=model)
    [r] = engine.generate([SampleRequest(PROMPT, seed=1, temperature=0.7, max_new_tokens=10)])
    assert r.finish_reason == "stop" and r.stop_token_id == 2 and r.num_output_tokens == 2
    assert not set(r.response_token_ids) & {0, 1, 2, 3}


def test_transformers_engine_results_never_hold_a_stop_token(hf_engine):
    requests = [SampleRequest(PROMPT, seed=s, temperature=1.0, max_new_tokens=12) for s in range(6)]
    for r in hf_engine.generate(requests):
        assert not set(r.response_token_ids) & set(hf_engine.stop_token_ids)
        assert (r.finish_reason, r.stop_token_id is None) in (("stop", False), ("length", True))
        assert r.finish_reason == "stop" or r.num_output_tokens == 12


# ================================================================ length rule, empty prompt (items 4, 5)


def test_prompt_over_the_window_is_refused_up_front(tiny_model_dir, tiny_backbone):
    """The issue's input: an 8,188-token prompt with 12 new tokens on an 8,192-token window."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.config.max_position_embeddings = 8192
    calls = []
    model.generate = lambda *a, **k: calls.append(1)
    engine = make_engine("transformers", str(tiny_model_dir), (3,), model=model)
    assert engine.context_window == 8192
    ok = SampleRequest(PROMPT, 0, 0.7, 12)
    with pytest.raises(LenpredError) as e:
        engine.generate([ok, SampleRequest((7,) * 8188, 0, 0.7, 12)])
    assert str(e.value) == ("prompt (request 1) of 8188 tokens + max_new_tokens 12 exceeds the model's context "
                            "window of 8192: shorten it, lower max_new_tokens, or leave it out "
                            "(a benchmark build skips such prompts: max_prompt_tokens)")
    assert calls == []  # nothing generated: the whole batch is checked first
    check_requests([SampleRequest((7,) * 8180, 0, 0.7, 12)], 8192)  # 8,192 exactly fits


def test_tiny_window_is_the_models(hf_engine):
    assert hf_engine.context_window == 64
    with pytest.raises(LenpredError, match="prompt \\(request 0\\) of 60 tokens \\+ max_new_tokens 5 exceeds"):
        hf_engine.generate([SampleRequest((7,) * 60, 0, 0.7, 5)])


def test_empty_prompt_is_a_one_line_error(hf_engine):
    with pytest.raises(LenpredError) as e:
        hf_engine.generate([SampleRequest((), 0, 0.7, 4)])
    assert str(e.value) == "empty prompt (request 0): it has no tokens; drop the record or give it text"


# ================================================================ sampling parameters (item 7)


def test_model_generation_defaults_are_not_applied(tiny_model_dir, tiny_backbone, tmp_path):
    """A generation_config.json with a repetition penalty, top-k and an n-gram ban changes nothing."""
    d = tmp_path / "with-defaults"
    shutil.copytree(tiny_model_dir, d)
    (d / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": 3, "repetition_penalty": 5.0, "top_k": 2, "no_repeat_ngram_size": 1, "temperature": 0.1}))
    requests = [SampleRequest(PROMPT, seed=s, temperature=1.0, max_new_tokens=16) for s in range(4)]
    plain = make_engine("transformers", str(tiny_model_dir), (0, 1, 2, 3)).generate(requests)
    engine = make_engine("transformers", str(d), (0, 1, 2, 3))
    assert engine.generate(requests) == plain
    assert engine.model.generation_config.repetition_penalty == 5.0  # the model's own config is left as it was


def test_request_sampling_params_are_applied(hf_engine):
    """top_k=1 is greedy: every seed gives the same tokens (the parameters reach generate)."""
    requests = [SampleRequest(PROMPT, seed=s, temperature=1.0, max_new_tokens=8, top_k=1) for s in range(3)]
    out = hf_engine.generate(requests)
    assert out[0] == out[1] == out[2]
    assert requests[0].sampling_params() == {"temperature": 1.0, "top_p": 1.0, "top_k": 1, "min_p": 0.0,
                                             "repetition_penalty": 1.0, "max_new_tokens": 8}


# ================================================================ vLLM engine behind a fake import (items 3, 4, 7, 11)


class FakeLLM:
    instances: list = []
    fail_with: BaseException | None = None
    completions: list = []

    def __init__(self, **kwargs):
        if FakeLLM.fail_with is not None:
            raise FakeLLM.fail_with
        self.kwargs = kwargs
        self.calls = []
        FakeLLM.instances.append(self)

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append((prompts, params))
        return [SimpleNamespace(outputs=[c]) for c in FakeLLM.completions[:len(prompts)]]


@pytest.fixture()
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    FakeLLM.instances, FakeLLM.fail_with, FakeLLM.completions = [], None, []
    yield module


def completion(token_ids, finish_reason, stop_reason=None):
    return SimpleNamespace(token_ids=list(token_ids), finish_reason=finish_reason, stop_reason=stop_reason)


def test_vllm_defaults_suit_a_shared_machine(fake_vllm, tiny_model_dir):
    import os

    engine = make_engine("vllm", str(tiny_model_dir), (0, 1, 2, 3))
    kw = FakeLLM.instances[0].kwargs
    assert kw["kv_cache_memory_bytes"] == 2 * 2**30  # explicit KV cache: no "92 % of memory must be free" check
    assert "gpu_memory_utilization" not in kw
    assert kw["generation_config"] == "vllm"  # never the model's generation_config.json
    assert kw["max_model_len"] == engine.context_window == 64  # the model's window, as in every other path
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


def test_vllm_options_reach_the_engine(fake_vllm, tiny_model_dir):
    import os

    options = VLLMOptions(kv_cache_space_gib=0.5, gpu_memory_utilization=0.3, cpu_threads_bind="nobind",
                          cpu_reserved_cores=1, max_model_len=48)
    engine = make_engine("vllm", str(tiny_model_dir), (3,), options)
    kw = FakeLLM.instances[0].kwargs
    assert kw["kv_cache_memory_bytes"] == 2**29 and kw["gpu_memory_utilization"] == 0.3
    assert kw["max_model_len"] == engine.context_window == 48
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    make_engine("vllm", str(tiny_model_dir), (3,), VLLMOptions(kv_cache_space_gib=None))
    assert "kv_cache_memory_bytes" not in FakeLLM.instances[1].kwargs


@pytest.mark.parametrize("bad, match", [
    (dict(kv_cache_space_gib=0), "kv-cache-space-gib"), (dict(gpu_memory_utilization=1.5), "gpu-memory-utilization"),
    (dict(cpu_reserved_cores=-1), "cpu-reserved-cores"), (dict(cpu_threads_bind=" "), "cpu-threads-bind")])
def test_vllm_options_are_checked(bad, match):
    with pytest.raises(LenpredError, match=match):
        VLLMOptions(**bad)


def test_vllm_max_model_len_over_the_window_is_refused(fake_vllm, tiny_model_dir):
    with pytest.raises(LenpredError, match="max_model_len 4096 exceeds the model's context window of 64"):
        make_engine("vllm", str(tiny_model_dir), (3,), VLLMOptions(max_model_len=4096))


def test_vllm_memory_refusal_is_one_line_naming_the_option(fake_vllm, tiny_model_dir):
    FakeLLM.fail_with = ValueError(
        "Available memory on node 0 (4.85/18.0 GiB) on startup is less than desired CPU memory utilization "
        "(0.92, 16.56 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls ...\nmore lines")
    with pytest.raises(LenpredError) as e:
        make_engine("vllm", str(tiny_model_dir), (3,), VLLMOptions(kv_cache_space_gib=None))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("vLLM refused to start for lack of free memory (Available memory on node 0")
    assert "--kv-cache-space-gib, now None" in msg and "--gpu-memory-utilization" in msg


def test_vllm_wrapped_start_failure_is_one_line(fake_vllm, tiny_model_dir):
    try:
        raise ValueError("Available memory on node 0 (1.0/8.0 GiB) on kv cache allocation is less than requested "
                         "memory for kv (2.00 GiB).")
    except ValueError as cause:
        wrapped = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
        wrapped.__cause__ = cause
    FakeLLM.fail_with = wrapped
    expected = (r"^vLLM refused to start for lack of free memory \(Engine core initialization failed.*"
                r"lower kv_cache_space_gib \(--kv-cache-space-gib, now 2.0\)")
    with pytest.raises(LenpredError, match=expected):
        make_engine("vllm", str(tiny_model_dir), (3,))
    FakeLLM.fail_with = RuntimeError("Engine core initialization failed. See root cause above.")
    with pytest.raises(LenpredError, match=r"^vLLM failed to start \(RuntimeError: Engine core initialization failed"):
        make_engine("vllm", str(tiny_model_dir), (3,))


def test_vllm_generate_records_stop_tokens_and_sampling(fake_vllm, tiny_model_dir):
    engine = make_engine("vllm", str(tiny_model_dir), (0, 1, 2, 3))
    FakeLLM.completions = [completion([7, 8, 3], "stop", None),        # EOS kept in the output
                           completion([7, 2], "stop", 2),              # a new turn start (stop_token_ids match)
                           completion([7, 8], "stop", 1),              # stop token not kept: from stop_reason
                           completion([7, 8, 9], "length")]
    requests = [SampleRequest(PROMPT, s, 0.7, 3) for s in range(4)]
    assert engine.generate(requests) == [SampleResult((7, 8), "stop", 3), SampleResult((7,), "stop", 2),
                                         SampleResult((7, 8), "stop", 1), SampleResult((7, 8, 9), "length", None)]
    prompts, params = FakeLLM.instances[0].calls[0]
    assert prompts[0] == {"prompt_token_ids": list(PROMPT)}
    assert params[1] == dict(temperature=0.7, top_p=1.0, top_k=-1, min_p=0.0, repetition_penalty=1.0,
                             presence_penalty=0.0, frequency_penalty=0.0, seed=1, max_tokens=3,
                             stop_token_ids=[0, 1, 2, 3], ignore_eos=False, detokenize=False)


def test_vllm_checks_lengths_before_generating(fake_vllm, tiny_model_dir):
    engine = make_engine("vllm", str(tiny_model_dir), (3,))
    with pytest.raises(LenpredError, match="empty prompt \\(request 1\\)"):
        engine.generate([SampleRequest(PROMPT, 0, 0.7, 3), SampleRequest((), 1, 0.7, 3)])
    with pytest.raises(LenpredError, match="prompt \\(request 0\\) of 60 tokens \\+ max_new_tokens 8 exceeds"):
        engine.generate([SampleRequest((7,) * 60, 0, 0.7, 8)])
    assert FakeLLM.instances[0].calls == []
