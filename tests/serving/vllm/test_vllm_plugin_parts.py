"""The vLLM plug-in's engine-independent parts, without vLLM: which rows are captured, the hooks on a fake layer,
the settings, and predictions from captured states equal the full ``LengthPredictor.predict`` (tiny model)."""

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lenpred.errors import LenpredError
from lenpred.pipeline import LengthPredictor
from lenpred.serving.vllm.capture import (CaptureTarget, LayerCapture, ScheduledRequest, capture_plan, collect_states,
                                          last_rows)
from lenpred.serving.vllm.config import EngineConfig
from lenpred.serving.vllm.worker import residual_stream_rows, scheduled_requests


def test_capture_plan_keeps_the_last_prompt_token_and_plp_steps():
    P = 10
    scheduled = [ScheduledRequest("whole", 0, P, P),  # whole prefill in one step
                 ScheduledRequest("chunk1", 0, 6, P),  # chunked: first chunk (not yet the last token)
                 ScheduledRequest("chunk2", 6, 4, P),  # second chunk computes token 10 = the last prompt token
                 ScheduledRequest("cached", 8, 2, P),  # prefix-cache hit of 8 tokens
                 ScheduledRequest("t1", P, 1, P),  # decode step consuming generated token 1
                 ScheduledRequest("t8", P + 7, 1, P),  # consumes generated token 8
                 ScheduledRequest("t9", P + 8, 1, P)]
    assert capture_plan(scheduled, plp_steps=(0, 8, 16)) == [
        CaptureTarget("whole", 0), CaptureTarget("chunk2", 0), CaptureTarget("cached", 0), CaptureTarget("t8", 8)]
    assert [t.request_id for t in capture_plan(scheduled)] == ["whole", "chunk2", "cached"]


def test_last_rows_from_query_start_loc():
    # three requests of 4, 1 and 3 tokens: rows 3, 4, 7
    assert last_rows(torch.tensor([0, 4, 5, 8], dtype=torch.int32), 3).tolist() == [3, 4, 7]


def test_collect_states_matches_rows_by_the_outputs_order_and_refuses_a_mismatched_step():
    rows = {15: torch.tensor([[0.0, 0.5], [1.0, 1.5], [2.0, 2.5]])}
    targets = [CaptureTarget("r0", 0), CaptureTarget("r1", 8), CaptureTarget("gone", 0)]
    step = collect_states(targets, rows, ["r2", "r0", "r1"])  # row k belongs to req_ids[k], not to the plan's order
    assert step.error is None and step.missing == ["gone"] and list(step.states) == ["r0", "r1"]
    assert step.states["r0"]["step"] == 0 and step.states["r1"]["step"] == 8
    np.testing.assert_array_equal(step.states["r0"]["states"][15], [1.0, 1.5])
    np.testing.assert_array_equal(step.states["r1"]["states"][15], [2.0, 2.5])
    assert step.states["r1"]["states"][15].dtype == np.float32
    wrong = collect_states(targets[:2], rows, ["r0", "r1"])  # 3 rows for 2 requests: never matched by guesswork
    assert wrong.states == {} and wrong.missing == ["r0", "r1"] and "3 rows for the output's 2" in wrong.error
    nothing = collect_states(targets[:1], {}, ["r0"])
    assert nothing.missing == ["r0"] and "captured nothing" in nothing.error
    assert collect_states([], rows, ["r2", "r0", "r1"]).states == {}


class _FusedLayer(torch.nn.Module):
    """Returns (hidden, residual) like vLLM's decoder layers: the stream is their sum."""

    def forward(self, x):
        return x * 2, x + 1


def test_layer_capture_sums_hidden_and_residual_at_each_last_row():
    layers = [_FusedLayer(), _FusedLayer()]
    qsl = torch.tensor([0, 2, 5])
    cap = LayerCapture(layers, (2,), row_starts=lambda: qsl, stream_rows=residual_stream_rows)
    x = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    layers[1](x)
    states = cap.take()
    # rows 1 and 4: 2x + (x + 1) = 3x + 1
    np.testing.assert_allclose(states[2].numpy(), 3 * x[[1, 4]].numpy() + 1)
    assert cap.take() == {} and cap.num_calls == 1
    cap.remove()
    layers[1](x)
    assert cap.take() == {}
    with pytest.raises(LenpredError, match="cannot be captured from a 2-layer model"):
        LayerCapture(layers, (3,), row_starts=lambda: qsl)
    none = LayerCapture(layers, (1,), row_starts=lambda: None)  # dummy / profiling runs: nothing kept
    layers[0](x)
    assert none.take() == {}


def test_layer_capture_reads_a_plain_layer_output_by_default():
    layer = torch.nn.Linear(2, 2, bias=False)
    torch.nn.init.eye_(layer.weight)  # identity: the output is the input
    cap = LayerCapture([layer], (1,), row_starts=lambda: torch.tensor([0, 3, 4]))
    x = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    with torch.no_grad():
        layer(x)
    np.testing.assert_allclose(cap.take()[1].numpy(), [[4.0, 5.0], [6.0, 7.0]])  # rows 2 and 3
    cap.remove()


def test_the_contract_module_imports_no_vllm_and_names_versions_and_attributes():
    import subprocess
    import sys

    from lenpred.serving.vllm.contract import missing_attribute, require_attributes, vllm_version_warning

    code = "import sys, lenpred.serving.vllm.contract; print([m for m in sys.modules if m.split('.')[0] == 'vllm'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert vllm_version_warning("0.32.0", "x") is None and vllm_version_warning("0.32.0+cpu", "x") is None
    assert vllm_version_warning("0.33.1", "the lenpred scheduler") == (
        "the lenpred scheduler was written for vLLM 0.32.0, and vLLM 0.33.1 is installed: it relies on non-public vLLM "
        "internals, so check its results (tests/serving/vllm/test_vllm_contract.py) or install vLLM 0.32.0")
    obj = SimpleNamespace(running=[], kv_cache_manager=SimpleNamespace(block_pool=SimpleNamespace()))
    assert missing_attribute(obj, ("running", "kv_cache_manager.block_pool")) is None
    assert missing_attribute(obj, ("running", "kv_cache_manager.block_pool.get_num_free_blocks", "gone")) == (
        "kv_cache_manager.block_pool.get_num_free_blocks")
    from dataclasses import dataclass

    @dataclass
    class Output:  # a field without a default is no class attribute, and still counts
        req_ids: list

    assert missing_attribute(Output, ("req_ids",)) is None and missing_attribute(Output, ("req_id_to_index",)) == (
        "req_id_to_index")
    with pytest.raises(LenpredError, match=r"^vLLM's Scheduler in vLLM 0.33.1 has no 'max_num_active_reqs', which the "
                                           r"lenpred plug-in \(written for vLLM 0.32.0\) needs: install vLLM 0.32.0$"):
        require_attributes(obj, ("running", "max_num_active_reqs"), "vLLM's Scheduler", "0.33.1")


def test_the_scheduler_module_imports_neither_the_worker_nor_the_capture():
    import ast
    from pathlib import Path

    import lenpred.serving.vllm as plugin

    tree = ast.parse((Path(plugin.__file__).parent / "scheduler.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "lenpred.serving.vllm.contract" in imported  # STATES_ATTR comes from here
    assert not {"lenpred.serving.vllm.worker", "lenpred.serving.vllm.capture"} & imported
    assert not [m for m in imported if m and m.startswith("vllm.v1.worker")]


def test_engine_config_takes_its_policy_names_and_properties_from_the_registry():
    from dataclasses import dataclass

    from lenpred.serving.parked import SchedulerConfig
    from lenpred.serving.policies import POLICIES, SJF, Policy, register

    assert EngineConfig(policy="observe").engine_policy() is None
    assert EngineConfig(policy="sjf", max_idle_s=5.0).engine_policy() == SJF(max_idle_s=5.0)
    assert EngineConfig(policy="srpt", plp=True).refreshes_remaining and not EngineConfig(policy="srpt"
                                                                                          ).refreshes_remaining
    assert not EngineConfig(policy="sjf").refreshes_remaining and not EngineConfig(policy="observe").refreshes_remaining
    shared = {f: getattr(SchedulerConfig(), f) for f in SchedulerConfig.__dataclass_fields__}
    assert {f: getattr(EngineConfig(), f) for f in shared} == shared  # one set of defaults: the measured design

    @register("lifo")
    @dataclass(frozen=True)
    class LIFO(Policy):  # a new policy is one registered class; its flags drive the engine
        reads_remaining = True
        rank_unit = "s"

        def rank(self, view):
            return -view.arrival_time_s

    try:
        cfg = EngineConfig(policy="lifo", plp=True)
        assert cfg.engine_policy() == LIFO() and cfg.refreshes_remaining
    finally:
        del POLICIES["lifo"]
    with pytest.raises(LenpredError, match="policy 'lifo' is unknown; valid: observe, fcfs, random, sjf, srpt, hrrn"):
        EngineConfig(policy="lifo")


def test_scheduled_requests_reads_new_and_cached_requests():
    out = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="a", prompt_token_ids=[1, 2, 3], num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=["b", "a"], num_computed_tokens=[7, 3]),
        num_scheduled_tokens={"a": 3, "b": 1}, finished_req_ids={"c"})
    lengths = {"b": 5, "c": 4}
    got = scheduled_requests(out, lengths)
    assert got == [ScheduledRequest("a", 0, 3, 3), ScheduledRequest("b", 7, 1, 5), ScheduledRequest("a", 3, 3, 3)]
    assert lengths == {"a": 3, "b": 5}  # finished requests forgotten
    resubmitted = SimpleNamespace(  # "b" aborted and resubmitted with another prompt between two steps
        scheduled_new_reqs=[SimpleNamespace(req_id="b", prompt_token_ids=[1, 2], num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], num_computed_tokens=[]),
        num_scheduled_tokens={"b": 2}, finished_req_ids={"b"})
    assert scheduled_requests(resubmitted, lengths) == [ScheduledRequest("b", 0, 2, 2)] and lengths["b"] == 2


def test_engine_config_refuses_unknown_keys_and_values():
    ok = EngineConfig.from_vllm(SimpleNamespace(additional_config={"lenpred": {"policy": "srpt", "decode_slots": 2}}))
    assert ok.policy == "srpt" and ok.decode_slots == 2
    assert EngineConfig.from_vllm(SimpleNamespace(additional_config=None)) == EngineConfig()
    with pytest.raises(LenpredError, match=r"unknown lenpred setting\(s\) slots in --additional-config; valid: policy, "
                                           "decode_slots, prefill_ahead, admit_by"):
        EngineConfig.from_vllm(SimpleNamespace(additional_config={"lenpred": {"slots": 2}}))
    with pytest.raises(LenpredError, match="policy 'lifo' is unknown; valid: observe, fcfs, random, sjf, srpt, hrrn"):
        EngineConfig(policy="lifo")
    for bad in ({"decode_slots": 0}, {"decode_slots": True}, {"decode_slots": 2.0}):
        with pytest.raises(LenpredError, match="decode_slots must be an integer >= 1"):
            EngineConfig(**bad)
    with pytest.raises(LenpredError, match="max_idle_s must be a number >= 0 or null, got '5'"):
        EngineConfig(max_idle_s="5")
    with pytest.raises(LenpredError, match="aging_tokens_per_s must be a number >= 0, got -1"):
        EngineConfig(aging_tokens_per_s=-1)
    with pytest.raises(LenpredError, match="plp must be true or false, got 'no'"):
        EngineConfig(plp="no")
    with pytest.raises(LenpredError, match="adaptive_interval 'ewma' is unknown; valid: None, aci, rolling"):
        EngineConfig(adaptive_interval="ewma")
    with pytest.raises(LenpredError, match="on_missing_state 'drop' is unknown; valid: unpredicted, refuse"):
        EngineConfig(on_missing_state="drop")
    assert EngineConfig.from_vllm(SimpleNamespace(additional_config={"lenpred": ok.to_json()[12:-1]})) == ok


def test_serving_with_no_head_captures_half_the_depth_and_only_observes(tiny_model_dir):
    """``predictor: "none"`` (lenpred.online.capture): observe + a traffic log only; the layer is half the served
    model's depth unless capture_layer says otherwise, checked against the model; a head takes no capture_layer."""
    from lenpred.backbone import local_model_revision
    from lenpred.serving.vllm.config import load_head

    headless = EngineConfig(predictor="none", policy="observe", traffic_log="t")
    served = SimpleNamespace(model_config=SimpleNamespace(model=str(tiny_model_dir), hf_config=SimpleNamespace(
        num_hidden_layers=30, hidden_size=576)))
    capture = load_head(headless, served)
    assert (capture.engine_layer, capture.width, capture.model_revision) == (
        15, 576, local_model_revision(tiny_model_dir))
    assert capture.log_metadata()["head"] == "none" and capture.log_metadata()["layers"] == "[15]"
    assert load_head(EngineConfig(predictor="none", policy="observe", traffic_log="t", capture_layer=7),
                     served).engine_layer == 7
    with pytest.raises(LenpredError, match="set capture_layer to 1..29"):
        load_head(EngineConfig(predictor="none", policy="observe", traffic_log="t", capture_layer=30), served)
    with pytest.raises(LenpredError, match="nothing to rank by: use policy observe"):
        EngineConfig(predictor="none", policy="srpt", traffic_log="t")
    with pytest.raises(LenpredError, match="set traffic_log"):
        EngineConfig(predictor="none", policy="observe")
    with pytest.raises(LenpredError, match="no adaptive_interval"):
        EngineConfig(predictor="none", policy="observe", traffic_log="t", adaptive_interval="aci")
    with pytest.raises(LenpredError, match="capture_layer is for predictor none"):
        EngineConfig(capture_layer=15)
    with pytest.raises(LenpredError, match="capture_layer must be an integer >= 1 .* got '15'"):
        EngineConfig(predictor="none", policy="observe", traffic_log="t", capture_layer="15")


@pytest.fixture(scope="module")
def fitted_last(tiny_bench, tiny_model_dir):
    bench, data, root = tiny_bench
    return LengthPredictor("last", str(tiny_model_dir), layers=(1,), coverage=0.5, epochs=3).fit(
        bench, data_dir=str(data), cache=str(root / "cache-layer1"))  # the estp fits cache layers (1, -1)


def test_predict_states_equals_predict_without_loading_the_model(fitted_last, tmp_path):
    from lenpred.prompts import prepare_prompt

    prompts = ["write a long poem about sea", "what is the sum of two and three"]
    assert fitted_last.engine_layer == 1
    backbone = fitted_last.backbone_
    with torch.no_grad():
        states = np.stack([backbone.model(torch.tensor([prepare_prompt(backbone.tokenizer, p).token_ids]),
                                          output_hidden_states=True).hidden_states[1][0, -1].numpy() for p in prompts])
    head = LengthPredictor.from_pretrained(fitted_last.save_pretrained(tmp_path / "p"), load_model=False)
    assert not hasattr(head, "backbone_")  # the engine path holds no model: no second forward pass exists
    full = fitted_last.predict(prompts, max_new_tokens=20)
    lengths = [p.num_prompt_tokens for p in full]
    from_states = head.predict_states(states, lengths, [20, 20])
    for a, b in zip(from_states, full):
        assert a.to_dict(True) == b.to_dict(True)
    with pytest.raises(LenpredError, match=r"predict_states needs \(2, 32\) states, got \(2, 3\)"):
        head.predict_states(states[:, :3], lengths, [20, 20])


def test_predictors_that_pool_many_tokens_are_refused_by_the_plugin(tiny_backbone):
    from conftest import fit_tiny_predictor

    from lenpred.serving.vllm.config import engine_head

    for method in ("egtp", "mean"):  # entropy weights; a mean over every token's state
        pooling = fit_tiny_predictor(tiny_backbone, method, 1)
        assert pooling.engine_layer is None
        with pytest.raises(LenpredError, match="reads more than one last-token state"):
            pooling.predict_states(np.zeros((1, 32), np.float32), [3], [5])
    assert engine_head(EngineConfig()).engine_layer == 15  # the shipped predictor: last@15



_METRICS = """
import os, sys
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from lenpred.serving.vllm.prometheus import PluginMetrics
m = PluginMetrics()
assert m.enabled
m.update({"predicted": 3, "head_s": 0.25, "released": 0})
m.update({"predicted": 5, "head_s": 0.5, "released": 1})
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)  # what vLLM's /metrics does with PROMETHEUS_MULTIPROC_DIR set
sys.stdout.write(generate_latest(registry).decode())
"""


def test_plugin_counters_reach_a_prometheus_multiprocess_directory(tmp_path):
    """The engine-core process writes, another process collects: each counter once, with the running total."""
    import subprocess
    import sys

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    text = subprocess.run([sys.executable, "-c", _METRICS], env=env, capture_output=True, text=True, check=True).stdout
    lines = [line for line in text.splitlines() if line.startswith("lenpred_")]
    assert "lenpred_predicted_total 5.0" in lines and "lenpred_head_seconds_total 0.5" in lines
    assert "lenpred_released_total 1.0" in lines and "lenpred_missing_states_total 0.0" in lines
    assert sum(line.startswith("lenpred_predicted_total ") for line in lines) == 1
