"""The one prompt oracle (:func:`lenpred.studies.workload.prompt_oracle`, :func:`~lenpred.studies.workload.
table_prompt_oracle`) that the engine benchmark and the simulator studies rank by, on a hand-worked table."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lenpred.errors import LenpredError
from lenpred.studies.workload import prompt_oracle, table_prompt_oracle

# prompt a (rl): 3 samples; b (rl): 1 sample; c (longseq): 2 samples; d (longseq): 1 sample
PIDS = ["a", "a", "a", "b", "c", "c", "d"]
SCEN = ["rl", "rl", "rl", "rl", "longseq", "longseq", "longseq"]
LENGTHS = [10, 20, 60, 100, 7, 9, 50]


def test_mean_of_the_other_samples_else_the_scenario_median_of_the_others():
    out = prompt_oracle(PIDS, LENGTHS, SCEN)
    assert out.dtype == np.float64 and out.shape == (7,)
    # a: (20 + 60) / 2, (10 + 60) / 2, (10 + 20) / 2; b alone: median of rl's other samples (10, 20, 60) = 20
    # c: the other one; d alone: median of longseq's other samples (7, 9) = 8; never a sample's own length
    assert out.tolist() == [40.0, 35.0, 15.0, 20.0, 9.0, 7.0, 8.0]


def test_a_lone_sample_of_a_lone_scenario_has_no_oracle():
    with pytest.raises(LenpredError, match="prompt e has one sample and scenario reasoning no other"):
        prompt_oracle([*PIDS, "e"], [*LENGTHS, 5], [*SCEN, "reasoning"])


def test_table_oracle_clips_to_the_caps_first():
    caps = [50, 50, 50, 512, 512, 512, 512]
    table = pa.table({"prompt_id": PIDS, "scenario": SCEN, "output_len": LENGTHS, "max_new_tokens": caps})
    # a's 60 is capped at 50: (20 + 50) / 2, (10 + 50) / 2, (10 + 20) / 2; b: median of (10, 20, 50)
    assert table_prompt_oracle(table).tolist() == [35.0, 30.0, 15.0, 20.0, 9.0, 7.0, 8.0]
    # every length clipped to 16 as well: a = (10, 16, 16), b = 16, c = (7, 9), d = 16
    assert table_prompt_oracle(table, max_tokens=16).tolist() == [16.0, 13.0, 13.0, 16.0, 9.0, 7.0, 8.0]
