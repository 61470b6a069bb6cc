"""The one resume rule (:func:`lenpred.studies.resume.load_resumable`): finished runs round-trip when the settings
match, and other settings are refused with the file, the differing keys and the fix in the message."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import pytest

from lenpred.errors import LenpredError
from lenpred.io import write_json
from lenpred.studies.resume import load_resumable


@dataclass
class _Cfg:
    seed: int = 0
    policies: tuple[str, ...] = ("fcfs", "sjf:oracle")
    draws: int = 2


def test_round_trip_keeps_finished_runs_and_takes_the_new_config(tmp_path):
    path = tmp_path / "runs.json"
    fresh = load_resumable(path, asdict(_Cfg()), fingerprint={"rate_per_s": 0.5})
    assert fresh == {"config": asdict(_Cfg()), "runs": {}, "rate_per_s": 0.5}
    fresh["runs"]["0/fcfs"] = {"mean_jct_s": 1.25}
    write_json(path, fresh)
    # tuples came back as lists, draws may grow (ignored): the finished run is kept
    again = load_resumable(path, asdict(_Cfg(draws=4)), ignore=("draws",), fingerprint={"rate_per_s": 0.5})
    assert again["runs"] == {"0/fcfs": {"mean_jct_s": 1.25}} and again["config"]["draws"] == 4
    assert list(again) == ["config", "runs", "rate_per_s"]


def test_other_settings_are_refused_naming_file_keys_and_fix(tmp_path):
    path = tmp_path / "runs.json"
    write_json(path, {"config": asdict(_Cfg()), "runs": {"0/fcfs": {}}, "rate_per_s": 0.5})
    with pytest.raises(LenpredError, match=r"runs\.json holds runs with other settings \(seed 0 \(now 1\)\): delete "
                                           r"it or write to another output directory"):
        load_resumable(path, asdict(_Cfg(seed=1)))
    with pytest.raises(LenpredError, match=r"draws 2 \(now 3\)"):  # not ignored: refused
        load_resumable(path, asdict(_Cfg(draws=3)))
    with pytest.raises(LenpredError, match=r"rate_per_s 0\.5 \(now 0\.7\)"):
        load_resumable(path, asdict(_Cfg()), fingerprint={"rate_per_s": 0.7})
    assert json.loads(path.read_text())["runs"] == {"0/fcfs": {}}  # nothing was overwritten


def test_a_setting_the_file_predates_counts_as_its_old_default(tmp_path):
    path = tmp_path / "runs.json"
    old = {k: v for k, v in asdict(_Cfg()).items() if k != "seed"}  # written before `seed` existed
    write_json(path, {"config": old, "runs": {"x": 1}})
    assert load_resumable(path, asdict(_Cfg(seed=5)))["runs"] == {"x": 1}  # no defaults: assumed to match
    assert load_resumable(path, asdict(_Cfg()), defaults={"seed": 0})["runs"] == {"x": 1}
    with pytest.raises(LenpredError, match=r"seed 0 \(now 5\)"):  # made at the old default 0, asked for 5
        load_resumable(path, asdict(_Cfg(seed=5)), defaults={"seed": 0})
    write_json(path, {"config": {**asdict(_Cfg()), "gone": 1}, "runs": {}})  # a setting that no longer exists
    with pytest.raises(LenpredError, match=r"gone 1 \(now None\)"):
        load_resumable(path, asdict(_Cfg()))
