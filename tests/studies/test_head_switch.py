"""The head-switch run's engine command (lenpred.studies.head_switch): its own port, vLLM's drain on SIGTERM, the
plug-in with the head and traffic log asked for, admission by prompt length under the priority queue."""

import json
from pathlib import Path

import pytest

from lenpred.studies.engine_bench import PORT
from lenpred.studies.head_switch import _command, _outcomes


def test_each_engine_gets_its_port_its_head_its_log_and_a_drain_bound():
    cmd = _command("/m", PORT + 2, "heads/new", Path("/t/traffic_b"), 600)
    assert cmd[cmd.index("--port") + 1] == str(PORT + 2) and str(PORT) not in cmd
    assert cmd[cmd.index("--shutdown-timeout") + 1] == "600"
    assert cmd[cmd.index("--scheduling-policy") + 1] == "priority" and cmd[cmd.index("--max-num-seqs") + 1] == "32"
    plugin = json.loads(cmd[cmd.index("--additional-config") + 1])["lenpred"]
    assert (plugin["predictor"], plugin["traffic_log"], plugin["admit_by"]) == ("heads/new", "/t/traffic_b",
                                                                               "prompt_len")


def test_outcomes_count_what_finished():
    got = _outcomes([{"outcome": "ok"}, {"outcome": "ok"}, {"outcome": "error"}])
    assert got == {"sent": 3, "ok": 2, "outcomes": {"ok": 2, "error": 1}}


def test_a_head_that_is_not_a_saved_predictor_is_refused_before_any_engine_starts(tmp_path):
    from lenpred.errors import LenpredError
    from lenpred.studies.head_switch import HeadSwitchConfig, run_head_switch

    (tmp_path / "head").mkdir()  # a directory without the predictor's config.json
    with pytest.raises(LenpredError, match=f"--new {tmp_path / 'head'} is not a saved predictor"):
        run_head_switch(HeadSwitchConfig(new=str(tmp_path / "head"), out=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
