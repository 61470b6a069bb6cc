"""``lenpred schedule <command>`` (issue 13): length-aware scheduling: workload predictions, cost-model calibration,
the simulator, the three real runs and their report; each command builds a study config and calls its ``run``."""

from __future__ import annotations

from pathlib import Path

import typer

from lenpred.cli_options import DATA_DIR_HELP, Opt, Options, off_if_empty, one_line_errors, with_options
from lenpred.errors import LenpredError
from lenpred.studies.simulate import SimExperimentConfig
from lenpred.studies.static_run import CalibrationConfig, StaticRunConfig
from lenpred.studies.vllm_offline import VLLMOfflineConfig
from lenpred.studies.vllm_serve import VLLMServeConfig
from lenpred.studies.workload import WorkloadConfig

MODEL_HELP = "Backbone: default alias, .gguf file, directory, package shipping a GGUF, or hub id."
TIMING_THREADS_HELP = "torch threads (time it on an otherwise idle machine)."
NUM_REQUESTS_HELP = "Requests per workload draw."
DRAWS_HELP = "Workload draws (bootstrap over draws)."
MAX_OUTPUT_LEN_HELP = "Only requests whose true length is at most this (tokens)."
WORKLOAD_HELP = "Prediction table of `lenpred schedule predictions` (its --out)."
PREDICTORS_DIR_HELP = "Saved predictors the table was built from (`lenpred evaluate`'s OUT/predictors)."
REREAD_BENCH_HELP = "Benchmark the table was built from (the prompts are re-read from it)."
RESUMED_OUT_HELP = "Output directory (resumes per run)."

schedule_app = typer.Typer(help="Length-aware scheduling: workload predictions, cost-model calibration, simulator, "
                                "real runs and their report.", no_args_is_help=True)


@schedule_app.command("predictions")
@one_line_errors
@with_options(Options(WorkloadConfig, {
    "predictors": "Saved predictors to run on the test split.",
    "predictors_dir": "Where `lenpred evaluate` saved them.", "bench": "Benchmark directory.",
    "out": "Cached prediction table."}))
def schedule_predictions(out: str, **options):
    """Predict every test request's length with each saved predictor (cached with a checksum; reruns reuse it)."""
    from lenpred.studies.workload import load_workload_table

    table = load_workload_table(path=out, **options, token_ids=False)
    typer.echo(f"{table.num_rows} test requests with predictions of {', '.join(options['predictors'])} in {out}")


@schedule_app.command("calibrate")
@one_line_errors
@with_options(Options(CalibrationConfig, {
    "model": MODEL_HELP, "batch_sizes": "Batch sizes measured.",
    "prompt_tokens": "Prompt lengths measured (random token ids).",
    "new_tokens": "Generated tokens per run (1 = prefill only).", "repeats": "Timed repeats per point (median kept).",
    "threads": TIMING_THREADS_HELP, "out": "Cost model JSON."}))
def schedule_calibrate(**options):
    """Time transformers `generate` on a grid and fit the simulator's cost model (prefill and decode-step time)."""
    from lenpred.studies.static_run import calibrate_transformers

    cfg = CalibrationConfig(**options)
    model = calibrate_transformers(cfg)
    typer.echo(f"{model.coefficients} fit {model.fit_stats} → {cfg.out}")


@schedule_app.command("simulate")
@one_line_errors
@with_options(Options(SimExperimentConfig, {
    "cost_model": "Calibrated cost model.", "predictors": "Predictors ranking requests (+ oracle).",
    "num_requests": NUM_REQUESTS_HELP, "draws": DRAWS_HELP,
    "max_num_seqs": "Concurrency limit (continuous) and static batch size.",
    "max_num_batched_tokens": "Token budget per step (continuous).",
    "arrivals": "Arrival processes: all, poisson, gamma.",
    "load": "Arrival rate as a share of the FCFS all-at-once throughput (req/s).",
    "cv": "Gamma inter-arrival coefficient of variation.",
    "aging_steps": Opt("vllm-ltr starvation guard for the +aging rows (0 = none).", convert=off_if_empty),
    "seed": "First workload / arrival seed.",
    "progressive": Opt("`lenpred progressive`'s test_estimates.parquet: srpt rows driven by its re-predictions (a "
                       "missing file or '' = none).", convert=off_if_empty),
    "workload": WORKLOAD_HELP, "bench": "Benchmark the table was built from.", "predictors_dir": PREDICTORS_DIR_HELP,
    "out": "Output directory."}))
def schedule_simulate(**options):
    """Simulate every policy × predictor on many workload draws; table, PNGs and JSON."""
    from rich.console import Console

    from lenpred.studies.scheduling_report import save_simulation_report
    from lenpred.studies.simulate import run_simulation

    cfg = SimExperimentConfig(**options)
    paths = save_simulation_report(run_simulation(cfg).to_dict(), cfg.out, Console(width=max(Console().width, 200)))
    typer.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


@schedule_app.command("run-static")
@one_line_errors
@with_options(Options(StaticRunConfig, {
    "model": MODEL_HELP, "num_requests": "Requests drawn from the test split.", "batch_size": "Static batch size.",
    "max_output_len": MAX_OUTPUT_LEN_HELP, "seed": "Workload draw seed.", "groupings": "Batch groupings (policies).",
    "cost_model": "Calibrated cost model.", "out": "Result JSON (resumes per grouping).",
    "threads": TIMING_THREADS_HELP, "workload": WORKLOAD_HELP, "bench": REREAD_BENCH_HELP,
    "predictors_dir": PREDICTORS_DIR_HELP}))
def schedule_run_static(**options):
    """Real run 1: static batches with transformers generate, each request forced to its true length; measured
    wall time, padding and tok/s vs the simulator's prediction."""
    from rich.console import Console

    from lenpred.studies.scheduling_report import save_static_real_report
    from lenpred.studies.static_run import run_static

    cfg = StaticRunConfig(**options)
    report = run_static(cfg)
    paths = save_static_real_report(report.to_dict(), Path(cfg.out).parent, Console(width=max(Console().width, 160)))
    typer.echo(f"wrote {cfg.out}, {', '.join(str(p) for p in paths.values())}")


@schedule_app.command("report")
@one_line_errors
@with_options(Options(SimExperimentConfig, {"out": "Directory holding the runs' JSON files."}))
def schedule_report(out: str):
    """Re-render every scheduling result found in OUT (simulator, real runs): tables and PNGs."""
    import json

    from rich.console import Console

    from lenpred.studies.scheduling_report import save_simulation_report, save_static_real_report
    from lenpred.studies.vllm_offline import save_offline_report
    from lenpred.studies.vllm_serve import save_serve_report

    console, found = Console(width=max(Console().width, 200)), []

    def markdown_only(save):  # the vLLM reports write Markdown and a PNG; show the Markdown
        return lambda report, out, console: console.print(save(report, out)["md"].read_text(), markup=False)

    for name, save in (("simulation.json", save_simulation_report), ("static_real.json", save_static_real_report),
                       ("vllm_offline.json", markdown_only(save_offline_report)),
                       ("vllm_serve.json", markdown_only(save_serve_report))):
        path = Path(out) / name
        if path.exists():
            save(json.loads(path.read_text()), out, console)
            found.append(name)
    if not found:
        raise LenpredError(f"no scheduling results in {out}: run `lenpred schedule simulate`, `run-static`, "
                           "`vllm-offline` or `vllm-serve` first")





# ---- the vLLM real runs (issue 13, part B) ----------------------------------------------------------------------
VLLM_RUN = {"num_requests": NUM_REQUESTS_HELP, "draws": DRAWS_HELP, "seed": "First workload seed.",
            "max_output_len": MAX_OUTPUT_LEN_HELP, "max_num_seqs": "vLLM concurrency limit (small, so requests queue)."}
"""The options both vLLM real runs share (their help texts; each run's config holds its own defaults)."""
VLLM_INPUTS = {"workload": WORKLOAD_HELP, "bench": REREAD_BENCH_HELP, "predictors_dir": PREDICTORS_DIR_HELP,
               "out": RESUMED_OUT_HELP}


@schedule_app.command("vllm-offline")
@one_line_errors
@with_options(Options(VLLMOfflineConfig, {
    **VLLM_RUN, "predictors": "Predictors whose predictions are priorities.",
    "fit_draws": "Draws whose steps fit the vLLM cost model (the rest are held out).", **VLLM_INPUTS}))
def schedule_vllm_offline(**options):
    """Real run 2: vllm.LLM with priority scheduling, FCFS vs SJF by each predictor vs oracle; the vLLM cost model
    and the simulator's replay. Needs vllm (`pip install -e '.\\[vllm]'`); run it on an otherwise idle machine."""
    from lenpred.studies.vllm_offline import run_vllm_offline, save_offline_report

    cfg = VLLMOfflineConfig(**options)
    paths = save_offline_report(run_vllm_offline(cfg), cfg.out)
    typer.echo(paths["md"].read_text())
    typer.echo(f"wrote {cfg.out}/vllm_offline.json, {cfg.out}/cost_vllm.json, "
               f"{', '.join(str(p) for p in paths.values())}")


@schedule_app.command("vllm-serve")
@one_line_errors
@with_options(Options(VLLMServeConfig, {
    **VLLM_RUN, "seed": "First workload / arrival seed.", "max_num_seqs": "vLLM concurrency limit.",
    "rate_per_s": Opt("Poisson arrivals (req/s) \\[default: --load x run 2's FCFS rate].", flag="--rate"),
    "load": "Arrival rate as a share of run 2's FCFS throughput (req/s).", "port": "vllm serve port (loopback).",
    "proxy_port": "lenpred serve port (loopback).",
    "predictor": "Predictor the proxy loads \\[default: the one shipped].",
    "vllm_cpus": "CPUs vllm serve is pinned to, e.g. 0 \\[default: not pinned].",
    "proxy_cpus": "CPUs lenpred serve and the load generator are pinned to, e.g. 1 \\[default: not pinned].",
    "ignore_eos": Opt("Force each request to its benchmark length (max_tokens = true length + ignore_eos): a "
                      "diagnostic, labelled so \\[default: natural EOS].", flag="--ignore-eos"),
    "max_tokens": "Cap sent with natural EOS (tokens) \\[default: the request's benchmark cap].",
    "temperature": "Sampling temperature with natural EOS (above 0: a per-request seed, the same in every mode).",
    "data_dir": DATA_DIR_HELP, **VLLM_INPUTS, "bench": "Benchmark the table was built from (its prompt files are "
                                                       "sent)."}))
def schedule_vllm_serve(**options):
    """Real run 3: starts vllm serve --scheduling-policy priority and lenpred serve in front (both killed on
    exit), replays Poisson arrivals with streaming requests: FCFS vs predicted vs oracle priority."""
    from lenpred.studies.vllm_serve import run_vllm_serve, save_serve_report

    cfg = VLLMServeConfig(**options)
    paths = save_serve_report(run_vllm_serve(cfg), cfg.out)
    typer.echo(paths["md"].read_text())
    typer.echo(f"wrote {cfg.out}/vllm_serve.json, {', '.join(str(p) for p in paths.values())}")


