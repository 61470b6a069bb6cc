"""Scheduling workloads: the benchmark's test split with true output lengths and each fitted predictor's static
predictions, computed once and cached, and seeded draws of requests from it.

The cached table (``results/scheduling/test_predictions.parquet``) holds no prompt text or token ids (the
repository never stores prompt data): :func:`load_workload_table` re-attaches each prompt's chat-formatted token
ids from the data sets with the tokenizer alone (no model load).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lenpred.backbone import DEFAULT_MODEL, resolve_model
from lenpred.bench.user_prompts import prompt_messages
from lenpred.errors import LenpredError
from lenpred.io import file_sha256, read_parquet_checked, stable_hash, write_parquet_checked
from lenpred.prompts import prepare_prompt
from lenpred.studies import DEFAULT_BENCH

# torch / pyarrow modules (dataset, tuning, predictors, bench.records) are imported inside the functions, so the
# study's config and the table helpers import without them.
logger = logging.getLogger(__name__)

DEFAULT_PREDICTORS = ("estp", "egtp", "trail", "ssjf_reg", "last")
DEFAULT_TABLE = Path("results/scheduling/test_predictions.parquet")
DEFAULT_PREDICTORS_DIR = "results/evaluate/predictors"
"""Where ``lenpred evaluate`` (default ``--out``) saves its fitted predictors."""
_COLUMNS = ("request_index", "prompt_id", "sample_index", "scenario", "num_prompt_tokens", "output_len",
            "max_new_tokens", "censored")


@dataclass
class WorkloadConfig:
    """Settings of ``lenpred schedule predictions``: which table to build from which inputs.

    Attributes:
        out: the cached prediction table (Parquet with a checksum), read by the scheduling runs' ``workload``.
        bench: the benchmark whose test split the table holds.
        predictors_dir: where ``lenpred evaluate`` saved the fitted predictors (``<evaluate out>/predictors``).
        predictors: the saved predictors to run on the test split (one ``pred_<name>`` column each).
    """

    out: str = str(DEFAULT_TABLE)
    bench: str = DEFAULT_BENCH
    predictors_dir: str = DEFAULT_PREDICTORS_DIR
    predictors: tuple[str, ...] = DEFAULT_PREDICTORS


@dataclass
class WorkloadRequest:
    """One request of a scheduling run.

    Attributes:
        request_id: position in the drawn workload (``0..n-1``); also the FCFS order of all-at-once arrivals.
        prompt_token_ids: the chat-formatted prompt as the model's token ids (empty when the table was loaded
            without them: simulator-only use).
        output_len: the benchmark's true output length in tokens (EOS excluded; capped responses at their cap).
        max_new_tokens: the request's generation cap in tokens.
        scenario: ``longseq``, ``reasoning`` or ``rl``.
        prompt_id: the benchmark prompt (several samples of one prompt share it; bootstrap clusters).
        predictions: ``{predictor name: predicted output length in tokens}``, clipped to ``[0, max_new_tokens]``;
            ``oracle`` is the true length.
        num_prompt_tokens: prompt length in tokens (known even without ``prompt_token_ids``).
        arrival_time_s: set by the arrival process of a run (0 for all-at-once).
        table_row: the row of the prediction table it was drawn from (``request_index``: the test sample), the key
            of per-sample data such as progressive re-predictions.
    """

    request_id: int
    prompt_token_ids: list[int]
    output_len: int
    max_new_tokens: int
    scenario: str
    prompt_id: str
    predictions: dict[str, float]
    num_prompt_tokens: int = 0
    arrival_time_s: float = 0.0
    table_row: int = -1

    def priority(self, predictor: str) -> int:
        """vLLM-style integer priority (lower runs first): the rounded predicted length."""
        return int(round(self.predictions[predictor]))


def _bench_fingerprint(bench: str | Path) -> str:
    """Hash of :func:`lenpred.bench.records.benchmark_key`."""
    from lenpred.bench.records import benchmark_key

    return stable_hash(benchmark_key(bench))


def _predictor_files(predictors_dir: Path, predictors: tuple[str, ...]) -> dict[str, Path]:
    return {name: predictors_dir / f"{name}.safetensors" for name in predictors}


def _inputs_fingerprint(bench: str | Path, predictors_dir: Path, predictors: tuple[str, ...]) -> str:
    """Hash of what the table depends on: the benchmark manifest and the predictor files' bytes.

    Raises:
        LenpredError: a predictor file is missing.
    """
    from lenpred.bench.records import benchmark_key

    files = {}
    for name, path in _predictor_files(predictors_dir, predictors).items():
        if not path.exists():
            raise LenpredError(f"{path} is missing: run `lenpred evaluate` (it saves the fitted predictors) or pass "
                               "--predictors naming the ones that exist")
        files[name] = file_sha256(path)
    return stable_hash({**benchmark_key(bench), "files": files})


def build_workload_table(bench: str | Path = DEFAULT_BENCH,
                         predictors_dir: str | Path = DEFAULT_PREDICTORS_DIR,
                         predictors: tuple[str, ...] = DEFAULT_PREDICTORS, model: str = DEFAULT_MODEL,
                         threads: int | None = None):
    """Predict every test request's length with each saved predictor, the way ``lenpred evaluate`` scores them
    (same loading path :func:`lenpred.dataset.load_dataset`, predictions clipped to each request's cap by
    :func:`lenpred.tuning.clipped_predict`).

    Returns:
        a ``pyarrow.Table``, one row per test sample: the :data:`_COLUMNS` plus ``pred_<name>`` (float64 tokens).
        Its schema metadata holds ``fingerprint`` (:func:`_inputs_fingerprint`), ``bench_fingerprint``
        (:func:`_bench_fingerprint`) and the predictor list.
    """
    import pyarrow as pa

    from lenpred.dataset import load_dataset
    from lenpred.tuning import check_run_settings, clipped_predict
    from lenpred.predictors import PREDICTORS, Predictor

    predictors_dir = Path(predictors_dir)
    fingerprint = _inputs_fingerprint(bench, predictors_dir, predictors)
    check_run_settings(tuple(predictors), threads=threads)
    run = load_dataset(str(bench), {i for m in predictors for i in PREDICTORS[m]().reads().inputs}, model=model, threads=threads)
    data, test = run.data, run.data.index["test"]
    requests = data.rows("test")
    cols = {"request_index": np.arange(len(test)), "prompt_id": data.cols["prompt_id"][test].astype(str),
            "sample_index": data.cols["sample_index"][test].astype(np.int64),
            "scenario": data.cols["scenario"][test].astype(str),
            "num_prompt_tokens": data.cols["num_prompt_tokens"][test].astype(np.int64),
            "output_len": data.y[test].astype(np.int64),
            "max_new_tokens": data.cols["max_new_tokens"][test].astype(np.int64),
            "censored": data.censored[test]}
    for name in predictors:
        cols[f"pred_{name}"] = clipped_predict(Predictor.load(predictors_dir / f"{name}.safetensors"), requests)
    table = pa.table({k: pa.array(np.asarray(v).tolist()) for k, v in cols.items()})
    return table.replace_schema_metadata({"fingerprint": fingerprint, "predictors": json.dumps(list(predictors)),
                                          "bench": str(bench), "bench_fingerprint": _bench_fingerprint(bench),
                                          "model_revision": run.backbone.revision})


def load_workload_table(path: str | Path = DEFAULT_TABLE, bench: str | Path = DEFAULT_BENCH,
                        predictors_dir: str | Path = DEFAULT_PREDICTORS_DIR,
                        predictors: tuple[str, ...] = DEFAULT_PREDICTORS, token_ids: bool = True,
                        data_dir: str | None = None, model: str = DEFAULT_MODEL, rebuild: bool = True):
    """The cached test-prediction table, rebuilt (and re-saved) when missing, corrupt (checksum) or stale (the
    benchmark or a predictor file changed).

    When the predictor files are absent (a fresh clone: ``lenpred evaluate`` saves them, git ignores them), the
    committed table is used as it is if its checksum holds, it was built from this benchmark (``bench_fingerprint``)
    and it has a column for every requested predictor; a warning is logged (``logging``) saying so.

    Args:
        token_ids: attach a ``prompt_token_ids`` column (list<int32>) re-prepared from the data sets with the
            tokenizer (:func:`lenpred.prompts.prepare_prompt`); ``False`` for simulator-only use.
        rebuild: ``False`` raises instead of rebuilding (the build loads the model: minutes).

    Raises:
        LenpredError: the cache is unusable and ``rebuild`` is ``False``; a predictor file is missing and the table
            cannot stand in for it; a prompt re-tokenises to a different length than the benchmark recorded.
    """
    import pyarrow as pa

    path = Path(path)
    table = read_parquet_checked(path)
    meta = {k.decode(): v.decode() for k, v in ((table.schema.metadata or {}) if table is not None else {}).items()}
    missing = [str(f) for f in _predictor_files(Path(predictors_dir), predictors).values() if not f.exists()]
    if missing and table is not None:
        if meta.get("bench_fingerprint") != _bench_fingerprint(bench):
            raise LenpredError(f"{path} was built from another benchmark than {bench} and {missing[0]} is missing: "
                               "run `lenpred evaluate`, then `lenpred schedule predictions`")
        check_predictors(table, predictors)
        logger.warning("note: %d predictor file(s) missing (first: %s): using %s as it is (checksum and benchmark "
                       "match)", len(missing), missing[0], path)
    elif table is None or meta.get("fingerprint") != _inputs_fingerprint(bench, Path(predictors_dir), predictors):
        if not rebuild:
            raise LenpredError(f"{path} is missing, corrupt or stale: run `lenpred schedule predictions` to rebuild it")
        table = build_workload_table(bench, predictors_dir, predictors, model)
        write_parquet_checked(table, path)
    if token_ids:
        ids = _prompt_token_ids(bench, model, data_dir, table)
        table = table.append_column("prompt_token_ids", pa.array(ids, type=pa.list_(pa.int32())))
    return table


def check_predictors(table, names) -> None:
    """Every requested predictor has a ``pred_<name>`` column in the workload table.

    Raises:
        LenpredError: one has none (the message lists those the table holds and how to add others).
    """
    have = [c[len("pred_"):] for c in table.column_names if c.startswith("pred_")]
    absent = [n for n in names if n not in have]
    if absent:
        raise LenpredError(f"the workload table has no predictions of {', '.join(absent)}: use --predictors with "
                           f"{', '.join(have)}, or save those predictors (`lenpred evaluate`) and run `lenpred schedule "
                           "predictions --predictors ...`")


def _prompt_token_ids(bench, model: str, data_dir: str | None, table) -> list[list[int]]:
    """Each row's chat-formatted prompt token ids, re-read from the data sets (tokenizer only)."""
    from transformers import AutoTokenizer

    from lenpred.bench.records import read_manifest

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model)[0])
    prompt_files = read_manifest(Path(bench)).get("prompt_files")
    cache: dict[str, list[int]] = {}
    out = []
    for pid, n in zip(table.column("prompt_id").to_pylist(), table.column("num_prompt_tokens").to_pylist()):
        if pid not in cache:
            cache[pid] = list(prepare_prompt(tokenizer, prompt_messages(pid, data_dir, prompt_files)).token_ids)
            if len(cache[pid]) != n:
                raise LenpredError(f"prompt {pid} has {len(cache[pid])} tokens now but {n} in the benchmark: the data "
                                   "directory or chat template differs from the one the benchmark was built with")
        out.append(cache[pid])
    return out


def progressive_estimates(path: str | Path, table) -> dict[str, dict[int, dict[int, float]]]:
    """Re-predictions at decode steps for the workload's requests, from ``lenpred progressive``'s
    ``test_estimates.parquet``, as :func:`lenpred.serving.policies.progressive_remaining` reads them.

    Returns:
        ``{method: {table row: {decode step: predicted total output length in tokens (step + remaining)}}}``
        for the exported methods (``plp``, ``trail_progressive``, ``static_conditional``).

    Raises:
        LenpredError: the file is missing or fails its checksum (rerun ``lenpred progressive``), or a test
            request of the table has no estimate at step 0 (the two were made from different benchmarks).
    """
    est = read_parquet_checked(path)
    if est is None:
        raise LenpredError(f"{path} is missing or fails its checksum: run `lenpred progressive` to write it")
    methods = json.loads((est.schema.metadata or {}).get(b"methods", b"[]"))
    row_of = {(p, int(s)): r for r, (p, s) in enumerate(zip(table.column("prompt_id").to_pylist(),
                                                              table.column("sample_index").to_pylist()))}
    cols = est.to_pydict()
    out: dict[str, dict[int, dict[int, float]]] = {m: {} for m in methods}
    for i, (pid, sample, step) in enumerate(zip(cols["prompt_id"], cols["sample_index"], cols["step"])):
        row = row_of.get((pid, int(sample)))
        if row is None:
            continue
        for m in methods:
            out[m].setdefault(row, {})[int(step)] = float(step) + float(cols[m][i])
    missing = [r for r in range(table.num_rows) if 0 not in out[methods[0]].get(r, {})] if methods else [0]
    if missing:
        raise LenpredError(f"{len(missing)} of {table.num_rows} test requests have no step-0 estimate in {path}: it "
                           "was written for another benchmark; rerun `lenpred progressive`")
    return out


def predictor_names(table) -> list[str]:
    """The predictors whose ``pred_<name>`` columns the table holds (``oracle`` not included)."""
    return [c[len("pred_"):] for c in table.column_names if c.startswith("pred_")]


def prompt_oracle(prompt_ids, lengths, scenarios) -> np.ndarray:
    """The prompt oracle, the best any prompt-only predictor can do: per sample, the mean length of its prompt's
    *other* samples; for a prompt with no other sample, the median length of its scenario's other samples. Never the
    sample's own length. The one rule of the engine benchmark and the simulator studies.

    Args:
        prompt_ids, scenarios: ``(n,)`` the prompt and scenario of each sample.
        lengths: ``(n,)`` output lengths in tokens, already clipped to each request's cap.

    Returns:
        ``(n,)`` float64, tokens.

    Raises:
        LenpredError: a single-sample prompt whose scenario has no other sample (nothing to fall back on).
    """
    pids, scen = np.asarray(prompt_ids), np.asarray(scenarios)
    y = np.asarray(lengths, dtype=np.float64)
    out = np.empty_like(y)
    for pid in np.unique(pids):
        idx = np.flatnonzero(pids == pid)
        if len(idx) > 1:
            out[idx] = (y[idx].sum() - y[idx]) / (len(idx) - 1)
            continue
        others = np.flatnonzero(scen == scen[idx[0]])
        others = others[others != idx[0]]
        if not len(others):
            raise LenpredError(f"prompt {pid} has one sample and scenario {scen[idx[0]]} no other: no prompt oracle")
        out[idx] = np.median(y[others])
    return out


def table_prompt_oracle(table, max_tokens: int | None = None) -> np.ndarray:
    """:func:`prompt_oracle` of a workload table's rows ``(rows,)`` float64, tokens: each recorded length clipped to
    its cap and to ``max_tokens`` (``None``: the caps alone) first. What the engine benchmark sends and the simulator
    studies rank by."""
    col = lambda c: table.column(c).to_pylist()  # noqa: E731
    caps = np.asarray(col("max_new_tokens"))
    if max_tokens is not None:
        caps = np.minimum(caps, max_tokens)
    return prompt_oracle(col("prompt_id"), np.minimum(np.asarray(col("output_len")), caps), col("scenario"))


def draw_workload(table, n: int, seed: int, scenario_mix: dict[str, float] | None = None,
                  max_output_len: int | None = None) -> list[WorkloadRequest]:
    """Sample ``n`` distinct requests (without replacement) from the table, seeded.

    Args:
        scenario_mix: ``{scenario: share}`` (normalised; shares rounded to counts by largest remainder);
            ``None``: uniform over all rows (the test split's own mix).
        max_output_len: keep only rows with ``output_len <= max_output_len`` (for real runs with a time budget).

    Returns:
        requests in draw order with ``request_id`` 0..n-1; ``predictions`` holds every predictor plus ``oracle``.

    Raises:
        LenpredError: fewer eligible rows than requested, or an unknown scenario in the mix.
    """
    rng = np.random.default_rng(seed)
    scen = np.asarray(table.column("scenario").to_pylist())
    out_len = np.asarray(table.column("output_len").to_pylist())
    eligible = np.ones(len(scen), bool) if max_output_len is None else out_len <= max_output_len
    if scenario_mix is None:
        pool = np.flatnonzero(eligible)
        if len(pool) < n:
            raise LenpredError(f"only {len(pool)} eligible requests for a workload of {n}: lower n or raise the cap")
        rows = rng.choice(pool, size=n, replace=False)
    else:
        rows = _draw_mix(rng, scen, eligible, n, scenario_mix)
    return [_request(table, int(r), i) for i, r in enumerate(rows)]


def _draw_mix(rng, scen: np.ndarray, eligible: np.ndarray, n: int, mix: dict[str, float]) -> np.ndarray:
    unknown = sorted(set(mix) - set(scen.tolist()))
    if unknown or not mix or min(mix.values()) < 0 or sum(mix.values()) <= 0:
        raise LenpredError(f"bad scenario mix {mix}: give non-negative shares over {sorted(set(scen.tolist()))}")
    names = list(mix)
    share = np.array([mix[s] for s in names], float) / sum(mix.values())
    counts = np.floor(share * n).astype(int)
    counts[np.argsort(-(share * n - counts))[: n - counts.sum()]] += 1  # largest remainder
    rows = []
    for s, k in zip(names, counts):
        pool = np.flatnonzero(eligible & (scen == s))
        if len(pool) < k:
            raise LenpredError(f"scenario {s} has {len(pool)} eligible requests, the mix asks for {k}")
        rows.append(rng.choice(pool, size=k, replace=False))
    rows = np.concatenate(rows)
    return rows[rng.permutation(len(rows))]


def _request(table, row: int, request_id: int) -> WorkloadRequest:
    get = lambda c: table.column(c)[row].as_py()  # noqa: E731
    preds = {name: float(get(f"pred_{name}")) for name in predictor_names(table)}
    preds["oracle"] = float(get("output_len"))
    ids = get("prompt_token_ids") if "prompt_token_ids" in table.column_names else []
    return WorkloadRequest(request_id=request_id, prompt_token_ids=ids, output_len=int(get("output_len")),
                           max_new_tokens=int(get("max_new_tokens")), scenario=get("scenario"),
                           prompt_id=get("prompt_id"), predictions=preds, num_prompt_tokens=int(get("num_prompt_tokens")),
                           table_row=row)
