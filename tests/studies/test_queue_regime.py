"""The deep-queue regime's arithmetic (:mod:`lenpred.studies.queue_regime`) against hand-worked values: KV sizing from
a model config, the size of a sustained pattern, length classes, and the pattern and mode names."""

from __future__ import annotations

import numpy as np
import pytest

from lenpred.errors import LenpredError
from lenpred.studies.queue_regime import (QUEUE_MODES, Pattern, kv_bytes_per_token, kv_cache_bytes, length_classes,
                                          parse_modes, parse_pattern, parse_patterns, plugin_max_num_seqs,
                                          plugin_settings, sustained_num_requests)

SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576,
           "head_dim": 64}


def test_kv_bytes_per_token_from_a_config():
    # 2 (K, V) x 30 layers x 3 KV heads x 64 x 4 bytes (float32)
    assert kv_bytes_per_token(SMOLLM2) == 2 * 30 * 3 * 64 * 4 == 46_080
    # no head_dim: 576 / 9 = 64; no num_key_value_heads: every attention head keeps K and V
    plain = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32}
    assert kv_bytes_per_token(plain, dtype_bytes=2) == 2 * 2 * 4 * 8 * 2 == 256


def test_kv_cache_holds_d_requests_at_their_cap_with_a_one_request_floor():
    # D = 16, mean prompt 126.9, mean cap 683.5: ceil(16 x 810.4) = 12,967 tokens x 46,080 bytes
    assert kv_cache_bytes(16, 126.9, 683.5, 46_080, 2422) == (12_967 * 46_080, False)
    # D = 2 with caps clipped to 32: 2 x 158.9 -> 318 tokens, below one longest request (1,942 tokens -> 16 blocks
    # of 128, plus vLLM's null block = 17 x 128 = 2,176 tokens): the floor applies
    assert kv_cache_bytes(2, 126.9, 32.0, 46_080, 1942) == (2176 * 46_080, True)


def test_sustained_pattern_size_and_rate():
    assert sustained_num_requests(0.37 * 1.1, 600) == 244  # 244.2
    assert sustained_num_requests(0.001, 20) == 1  # never empty
    p = parse_pattern("gamma3x1.1")
    assert p.rate_req_s(0.5) == pytest.approx(0.55)
    assert p.num_requests(16, 0.5, 600) == 330
    times = p.arrival_times(330, 0.5, seed=3)
    assert times.shape == (330,) and times[0] == 0 and np.all(np.diff(times) >= 0)
    burst = parse_pattern("burst8")
    assert burst.num_requests(16, 0.5, 600) == 128 and burst.rate_req_s(0.5) is None
    assert np.array_equal(burst.arrival_times(4, 0.5, seed=0), np.zeros(4))


def test_length_classes_are_rank_thirds():
    # sorted: 1 (#1), 2 (#5) | 3 (#3), 5 (#0) | 7 (#4), 9 (#2)
    assert length_classes([5, 1, 9, 3, 7, 2]).tolist() == [1, 0, 2, 1, 2, 0]
    # ties keep their order; 7 requests: ranks 0-2 short, 3-4 medium, 5-6 long (rank x 3 // 7)
    assert length_classes([4, 4, 4, 4, 4, 4, 4]).tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert length_classes([]).tolist() == []


def test_pattern_names():
    assert parse_pattern("burst4") == Pattern("burst4", depth=4)
    assert parse_pattern("gamma1x0.9") == Pattern("gamma1x0.9", cv=1.0, load=0.9)
    assert [p.name for p in parse_patterns("burst8, gamma1x1.1,burst8")] == ["burst8", "gamma1x1.1"]
    for bad in ("burst0", "burst", "gamma1", "gamma0x1.1", "poisson0.9", "burst8 "):
        with pytest.raises(LenpredError, match="unknown arrival pattern .* burst<k> .* burst4, burst8, gamma1x0.9"):
            parse_pattern(bad)
    with pytest.raises(LenpredError, match="no arrival pattern"):
        parse_patterns(" , ")


def test_mode_names_and_plugin_settings():
    assert parse_modes("stock,plugin,stock") == ["stock", "plugin"]
    with pytest.raises(LenpredError, match="unknown mode.*fcfs; valid: stock, priority_lenpred, priority_prompt_len"):
        parse_modes("stock,fcfs")
    assert QUEUE_MODES["priority_prompt_len"].priority == "prompt_tokens"
    settings = plugin_settings(16, {"max_idle_s": 60})
    assert settings == {"policy": "srpt", "plp": False, "decode_slots": 16, "prefill_ahead": 16,
                        "admit_by": "prompt_len", "max_idle_s": 60}
    assert plugin_max_num_seqs(settings) == 32
    with pytest.raises(LenpredError, match="prefill_ahead must be an integer"):
        plugin_max_num_seqs(plugin_settings(16, {"prefill_ahead": None}))


def test_the_guarded_plugin_mode_sets_the_plugins_own_guard():
    from lenpred.serving.vllm.config import EngineConfig
    from lenpred.studies.queue_bench import QueueBenchConfig, mode_settings

    reg = {"decode_bound": 16, "kv_cache_bytes": 1, "max_model_len": 2422, "plugin": plugin_settings(16)}
    guard, plain = (mode_settings(m, reg, QueueBenchConfig()) for m in ("plugin_guard", "plugin"))
    assert guard["plugin"] == {**plain["plugin"], "aging_tokens_per_s": 4.0}
    assert "aging_tokens_per_s" not in plain["plugin"]
    assert guard["proxy"] is None and guard["max_num_seqs"] == 32 and guard["scheduling_policy"] == "priority"
    assert EngineConfig(**guard["plugin"]).aging_tokens_per_s == 4.0  # a setting the plug-in takes


def test_a_slices_modes_share_one_rate_but_slices_may_differ():
    # each slice is stretched to the capacity measured before its own sitting: draw 1 ran at 0.25 req/s on another
    # machine; adding draw 0's modes at 0.30 is fine, adding to draw 1 at 0.30 would pair two rates in one slice
    from lenpred.studies.queue_bench import check_rates

    store = {"runs": {"0/stock/tracecodex0.9": {"settings": {"rate_req_s": 0.30}},
                      "1/stock/tracecodex0.9": {"settings": {"rate_req_s": 0.25}},
                      "1/stock/burst8": {"settings": {"rate_req_s": None}}}}
    plan = {(d, "tracecodex0.9"): {"rate_req_s": 0.30} for d in (0, 1)} | {(1, "burst8"): {"rate_req_s": None}}
    check_rates(store, plan, [0])
    for now in ([1], [0, 1], None):
        with pytest.raises(LenpredError, match="draw 1's tracecodex0.9 runs in runs.json arrived at 0.2500 req/s, "
                                               "this setting plans 0.3000 req/s: a slice's modes pair only at one"):
            check_rates(store, plan, now)


def test_the_draws_checked_are_those_this_run_adds_to():
    # draw 0 has every mode asked, draw 1 lacks plugin, draw 2 has nothing: a rerun without --only-draws adds to 1
    # and 2 only, so draw 0's rate (another sitting's) is not checked
    from lenpred.studies.queue_bench import QueueBenchConfig, draws_left

    store = {"runs": {"0/stock/tracecodex0.9": {}, "0/plugin/tracecodex0.9": {}, "1/stock/tracecodex0.9": {}}}
    cfg = QueueBenchConfig(patterns="tracecodex0.9", modes="stock,plugin", draws=3, capacity_req_s=0.3)
    assert draws_left(cfg, store) == [1, 2]
    assert draws_left(QueueBenchConfig(patterns="tracecodex0.9", modes="stock,plugin", draws=3, only_draws="0,2",
                                       capacity_req_s=0.3), store) == [2]
    assert draws_left(QueueBenchConfig(patterns="tracecodex0.9", modes="stock", draws=2, capacity_req_s=0.3),
                      store) == []
