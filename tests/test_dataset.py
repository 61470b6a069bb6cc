"""Clean splits: no prompt text in two splits (hand-worked, and on the committed ForeLen benchmark)."""

import numpy as np
import pytest

from lenpred.dataset import cross_split_duplicates
from lenpred.prompts import normalise_text, prompt_text


def test_cross_split_duplicates_keeps_train_and_drops_later_copies():
    pid = np.array(["a", "b", "c", "d", "e", "e"])
    split = np.array(["train", "validation", "validation", "test", "test", "test"])
    texts = {"a": "Hello  World", "b": "hello world", "c": "other", "d": "OTHER ", "e": "new"}
    # b repeats a (train) after normalising; d repeats c (validation); e appears twice in test only: kept
    assert cross_split_duplicates(pid, split, texts).tolist() == [False, True, False, True, False, False]
    assert normalise_text(" A\n b\tC ") == "a b c"


def test_committed_forelen_benchmark_has_five_prompts_in_two_splits():
    from lenpred.bench.build import load_records
    from lenpred.bench.sources import default_data_dir
    from lenpred.bench.user_prompts import prompt_messages

    if not default_data_dir().is_dir():
        pytest.skip(f"no prompt data sets at {default_data_dir()} (set LENPRED_DATA_DIR)")
    table = load_records("benchmarks/smollm2-forelen")
    pid, split = np.array(table.column("prompt_id").to_pylist()), np.array(table.column("split").to_pylist())
    texts = {p: prompt_text(prompt_messages(p)) for p in set(pid.tolist())}
    drop = cross_split_duplicates(pid, split, texts)
    # MATH-500 is a subset of MATH; AlpacaEval holds Vicuna and Self-Instruct prompts
    assert sorted(set(pid[drop].tolist())) == ["alpaca_eval:515", "math:3565", "math:4920", "self_instruct:230",
                                               "vicuna_bench:79"]
    assert {s: int((drop & (split == s)).sum()) for s in ("train", "validation", "test")} == \
        {"train": 0, "validation": 12, "test": 8}
    kept = {s: {normalise_text(texts[p]) for p in pid[~drop & (split == s)]} for s in ("train", "validation", "test")}
    assert not (kept["train"] & kept["validation"]) and not (kept["train"] & kept["test"]) and \
        not (kept["validation"] & kept["test"])


def test_load_dataset_reads_the_benchmark_before_the_model(tmp_path):
    from lenpred.dataset import load_dataset
    from lenpred.errors import LenpredError

    with pytest.raises(LenpredError, match="holds no benchmark"):  # not a model-loading error: the model is never read
        load_dataset(tmp_path / "nosuch", {"signals"}, model=str(tmp_path / "no-model"))


def test_load_dataset_gives_requests_with_the_inputs_asked_for(tiny_bench, tiny_model_dir):
    from lenpred.dataset import check_layers, load_dataset

    bench, data_dir, root = tiny_bench
    ds = load_dataset(bench, {"signals"}, model=str(tiny_model_dir), data_dir=str(data_dir), cache=str(root / "cache"),
                      layers=(1, -1))
    L = ds.backbone.num_layers
    assert ds.layers == check_layers((1, -1), None, L) == (1, L)
    assert all(r.signals is not None and r.signals.layers == (1, L) for r in ds.data.requests)
    assert set(ds.timing) == {"signals"} and ds.values == {}
    assert ds.table.num_rows == len(ds.data.y) + sum(ds.data.dropped_duplicates.values())
    without = load_dataset(bench, set(), backbone=ds.backbone, data_dir=str(data_dir))
    assert all(r.signals is None for r in without.data.requests) and without.timing == {}
