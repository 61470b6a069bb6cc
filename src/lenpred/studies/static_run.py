"""Real static-batch runs with transformers ``generate``: the cost-model calibration and real run 1 (batches grouped
FCFS vs by each predictor's predicted length vs by true length).

Every request generates exactly its true output length: a logits processor (:class:`ExactLengthProcessor`) bans
the stop tokens before row ``i`` has ``Lᵢ`` tokens and forces one at ``Lᵢ``; greedy decoding. ``generate`` keeps
computing every row until the batch's longest ends (finished rows decode padding), so the padding is real.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from lenpred.backbone import DEFAULT_MODEL, eos_token_ids, load_backbone
from lenpred.engines.hf import without_model_defaults
from lenpred.errors import LenpredError
from lenpred.io import write_json
from lenpred.serving.cost_model import CostModel, hardware_description
from lenpred.serving.metrics import RequestTiming, summarize
from lenpred.serving.policies import make_policy, padding_ratio, static_batches
from lenpred.serving.simulator import simulate_static
from lenpred.studies import DEFAULT_BENCH, report_dict
from lenpred.studies.resume import load_resumable
from lenpred.torch_state import with_threads_of
from lenpred.studies.workload import DEFAULT_PREDICTORS_DIR, DEFAULT_TABLE, draw_workload, load_workload_table


class ExactLengthProcessor:
    """``transformers`` logits processor: row ``i`` emits a stop token exactly after ``lengths[i]`` new tokens.

    Args:
        lengths: ``(B,)`` new tokens per row (true output lengths).
        prompt_len: the padded prompt length (new tokens so far = ``input_ids.shape[1] − prompt_len``).
        stop_token_ids: tokens that end a turn (banned before ``Lᵢ``); the first is forced at ``Lᵢ``.
    """

    def __init__(self, lengths: list[int], prompt_len: int, stop_token_ids: tuple[int, ...]):
        import torch

        self.lengths = torch.tensor(lengths)
        self.prompt_len, self.stop = prompt_len, list(stop_token_ids)

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_len
        early = self.lengths > step
        scores[early.nonzero(as_tuple=True)[0][:, None], self.stop] = float("-inf")
        at_end = (self.lengths == step).nonzero(as_tuple=True)[0]
        if len(at_end):
            scores[at_end] = float("-inf")
            scores[at_end, self.stop[0]] = 0.0
        return scores


def generate_static_batch(model, prompts: list[list[int]], lengths: list[int], stop_token_ids: tuple[int, ...],
                          pad_token_id: int) -> tuple[float, list[int]]:
    """Run one static batch (prompts left-padded to the longest; greedy) and time it.

    Args:
        prompts: ``B`` prompt token-id lists.
        lengths: ``(B,)`` tokens each row must generate (≥ 0; ``generate`` runs ``max(lengths, 1)`` steps).

    Returns:
        ``(wall seconds of generate, tokens each row generated before its stop token)``.
    """
    import torch
    from transformers import GenerationConfig, LogitsProcessorList

    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, P), pad_token_id, dtype=torch.long)
    mask = torch.zeros((B, P), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding: the new tokens line up
        ids[i, P - len(p):] = torch.tensor(p)
        mask[i, P - len(p):] = 1
    steps = max(max(lengths), 1)
    gen = GenerationConfig(do_sample=False, max_new_tokens=steps, eos_token_id=list(stop_token_ids),
                           pad_token_id=pad_token_id)
    processors = LogitsProcessorList([ExactLengthProcessor(lengths, P, stop_token_ids)])
    with without_model_defaults(model), torch.inference_mode():
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, generation_config=gen, logits_processor=processors)
        wall = time.perf_counter() - t
    new = out[:, P:].tolist()
    produced = [next((j for j, tok in enumerate(row) if tok in stop_token_ids), len(row)) for row in new]
    return wall, produced


@dataclass
class CalibrationConfig:
    """``lenpred schedule calibrate`` settings (transformers engine).

    Attributes:
        model: backbone alias / path.
        batch_sizes, prompt_tokens, new_tokens: the measured grid (every combination); prompts are random token
            ids (seeded), so no data set is read. ``new_tokens`` 1 measures the prefill alone.
        repeats: timed repeats per point (the median is kept) after one untimed warm-up run.
        threads: torch threads (2 = this machine's cores; run under the CPU lock).
        seed: prompt-token seed.
        out: the cost model JSON.
    """

    model: str = DEFAULT_MODEL
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    prompt_tokens: tuple[int, ...] = (32, 128, 512)
    new_tokens: tuple[int, ...] = (1, 64, 256)
    repeats: int = 2
    threads: int = 2
    seed: int = 0
    out: str = "results/scheduling/cost_transformers.json"


@with_threads_of("threads")  # cfg.threads while it runs
def calibrate_transformers(cfg: CalibrationConfig):
    """Time ``generate`` on the grid, fit :class:`~lenpred.serving.cost_model.CostModel` and save it (with the
    raw measurements under ``settings["measurements"]``). Returns the model."""
    from tqdm.auto import tqdm

    backbone = load_backbone(cfg.model, num_threads=cfg.threads)
    stop = eos_token_ids(backbone.model_dir, backbone.tokenizer)
    rng = np.random.default_rng(cfg.seed)
    vocab = [i for i in range(backbone.tokenizer.vocab_size) if i not in stop][:20000]
    grid = [(B, P, L) for B in cfg.batch_sizes for P in cfg.prompt_tokens for L in cfg.new_tokens]
    generate_static_batch(backbone.model, [list(rng.choice(vocab, 16))] * 2, [8, 8], stop, stop[0])  # warm-up
    measurements = []
    for B, P, L in tqdm(grid, desc="calibrate transformers generate", unit="point"):
        prompts = [rng.choice(vocab, P).tolist() for _ in range(B)]
        walls = [generate_static_batch(backbone.model, prompts, [L] * B, stop, stop[0])[0] for _ in range(cfg.repeats)]
        measurements.append({"batch_size": B, "prompt_tokens": [P] * B, "num_new_tokens": L,
                             "wall_s": float(np.median(walls)), "repeats_s": walls})
    import torch

    hardware = hardware_description({"torch_threads": torch.get_num_threads()})
    model = CostModel.fit(measurements, engine="transformers", hardware=hardware, fused_prefill=False,
                          settings={**asdict(cfg), "model_revision": backbone.revision, "measurements": measurements})
    model.save(cfg.out)
    return model


@dataclass
class StaticRunConfig:
    """``lenpred schedule run-static`` settings (real run 1).

    Attributes:
        model: backbone alias / path.
        num_requests: requests drawn from the test split (only those whose true length ≤ ``max_output_len``).
        batch_size: static batch size.
        max_output_len: true-length cap of the drawn requests (tokens): keeps the run under ~10 minutes on 2 cores.
        seed: workload draw seed.
        groupings: ``fcfs`` and ``sjf:<predictor>`` (``sjf:oracle`` = true length) policies that form the batches.
        cost_model: the calibrated transformers cost model (the simulator's prediction of each run).
        out: result JSON (written after every grouping; a rerun with the same settings resumes, other settings are
            refused: :func:`lenpred.studies.resume.load_resumable`).
        threads: torch threads.
        workload: the prediction table of ``lenpred schedule predictions`` (its ``--out``); never rebuilt here.
        bench, predictors_dir: the benchmark and saved predictors the table was built from (its freshness check;
            the prompts' token ids are re-read from ``bench``'s data sets).
    """

    model: str = DEFAULT_MODEL
    num_requests: int = 48
    batch_size: int = 8
    max_output_len: int = 256
    seed: int = 0
    groupings: tuple[str, ...] = ("fcfs", "sjf:estp", "sjf:egtp", "sjf:trail", "sjf:ssjf_reg", "sjf:last",
                                  "sjf:oracle")
    cost_model: str = "results/scheduling/cost_transformers.json"
    out: str = "results/scheduling/static_real.json"
    threads: int = 2
    workload: str = str(DEFAULT_TABLE)
    bench: str = DEFAULT_BENCH
    predictors_dir: str = DEFAULT_PREDICTORS_DIR

    def __post_init__(self):
        if self.num_requests < 1 or self.batch_size < 1 or self.max_output_len < 1:
            raise LenpredError("num_requests, batch_size and max_output_len must be >= 1")


@dataclass
class StaticRunReport:
    """What :func:`run_static` returns; :meth:`to_dict` is the content of ``cfg.out`` (key for key), which
    :func:`lenpred.studies.scheduling_report.save_static_real_report` renders.

    Attributes:
        config: the :class:`StaticRunConfig` the runs were made with (as stored: tuples as lists).
        runs: per grouping: measured ``wall_s``, ``batch_wall_s``, ``throughput_tok_s``, ``padding_ratio``, mean /
            p90 JCT (s), the simulated ``sim_wall_s`` / ``sim_mean_jct_s`` and their relative errors, the batches'
            lengths and per-request JCTs.
        workload: the drawn requests (their table ids, true output lengths and prompt lengths in tokens).
        hardware: :func:`lenpred.serving.cost_model.hardware_description`.
        model_revision: the backbone's revision.
    """

    config: dict
    runs: dict
    workload: dict
    hardware: dict
    model_revision: str | None

    def to_dict(self) -> dict:
        """The result JSON's content, in its key order."""
        return report_dict(self)


@with_threads_of("threads")  # cfg.threads while it runs
def run_static(cfg: StaticRunConfig, table=None) -> StaticRunReport:
    """Real run 1: for each grouping, form the static batches, run them with ``generate`` one after another and
    record each batch's wall time; compare with the simulator's prediction from the cost model. The JSON is
    written to ``cfg.out`` after every grouping (a rerun with the same config resumes).

    Returns:
        the :class:`StaticRunReport` (``table``: the workload table; ``None``: read from ``cfg.workload``).

    Raises:
        LenpredError: ``cfg.out`` holds runs made with other settings, or ``generate`` produced other lengths than
            the forced ones (another stop-token rule).
    """
    from pathlib import Path

    from tqdm.auto import tqdm

    cost = CostModel.load(cfg.cost_model)
    table = table if table is not None else load_workload_table(cfg.workload, cfg.bench, cfg.predictors_dir,
                                                                model=cfg.model, rebuild=False)
    requests = draw_workload(table, cfg.num_requests, cfg.seed, max_output_len=cfg.max_output_len)
    out = Path(cfg.out)
    # a file from before a field existed ran at that field's default
    report = load_resumable(out, asdict(cfg), defaults=asdict(StaticRunConfig()))
    report["workload"] = {"request_ids_in_table": [r.prompt_id + f"#{i}" for i, r in enumerate(requests)],
                          "output_len": [r.output_len for r in requests],
                          "num_prompt_tokens": [r.num_prompt_tokens for r in requests]}
    backbone = load_backbone(cfg.model, num_threads=cfg.threads)
    stop = eos_token_ids(backbone.model_dir, backbone.tokenizer)
    report["hardware"] = hardware_description()
    report["model_revision"] = backbone.revision
    generate_static_batch(backbone.model, [requests[0].prompt_token_ids] * 2, [8, 8], stop, stop[0])  # warm-up
    for grouping in tqdm([g for g in cfg.groupings if g not in report["runs"]], desc="static real run",
                         unit="grouping"):
        batches = static_batches(requests, cfg.batch_size, make_policy(grouping))
        t, timings, walls = 0.0, [], []
        for batch in batches:
            wall, produced = generate_static_batch(backbone.model, [r.prompt_token_ids for r in batch],
                                                   [r.output_len for r in batch], stop, stop[0])
            if produced != [r.output_len for r in batch]:
                raise LenpredError(f"generate produced {produced} tokens where {[r.output_len for r in batch]} were "
                                   "forced: the stop-token rule of this model differs from the benchmark's")
            t += wall
            walls.append(wall)
            timings += [RequestTiming(r.request_id, 0.0, float("nan"), t, r.output_len, 0, r.prompt_id)
                        for r in batch]
        measured = summarize(timings, padding_ratio([[r.output_len for r in b] for b in batches]))
        simulated, _ = simulate_static(batches, cost)
        report["runs"][grouping] = {
            "wall_s": t, "batch_wall_s": walls, "throughput_tok_s": measured["throughput_tok_s"],
            "padding_ratio": measured["padding_ratio"], "mean_jct_s": measured["mean_jct_s"],
            "p90_jct_s": measured["p90_jct_s"], "sim_wall_s": simulated["makespan_s"],
            "sim_mean_jct_s": simulated["mean_jct_s"],
            "sim_wall_rel_error": simulated["makespan_s"] / t - 1,
            "sim_mean_jct_rel_error": simulated["mean_jct_s"] / measured["mean_jct_s"] - 1,
            "batch_lengths": [[r.output_len for r in b] for b in batches],
            "jct_s": [x.jct_s for x in sorted(timings, key=lambda x: x.request_id)]}
        write_json(out, report)
    return StaticRunReport(**report)
