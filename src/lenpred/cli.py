"""``lenpred <command>``: each command builds a config and calls one library function.

Each option is declared once, by its help text: its default and type are the config field's
(:mod:`lenpred.cli_options`); ``lenpred schedule ...`` lives in :mod:`lenpred.cli_schedule`. A
:class:`lenpred.LenpredError` (bad input the user can fix) is printed as one line and exits 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lenpred.backbone import DEFAULT_MODEL
from lenpred.bench.build import build_benchmark
from lenpred.bench.plan import BenchConfig
from lenpred.bench.user_prompts import PromptFileConfig
from lenpred.cli_options import DATA_DIR_HELP, Opt, Options, off_if_empty, one_line_errors, unset, with_options
from lenpred.cli_schedule import schedule_app
from lenpred.engines import VLLMOptions
from lenpred.errors import LenpredError
from lenpred.pipeline import LengthPredictor
from lenpred.serving.proxy.app import serve as run_proxy
from lenpred.serving.proxy.batching import BatchConfig
from lenpred.studies import DEFAULT_BENCH
from lenpred.studies.diagnose.config import DiagnoseConfig
from lenpred.studies.evaluate import DEMO_DEFAULTS, EvalConfig
from lenpred.studies.progressive import ProgressiveConfig
from lenpred.studies.traffic import TrafficReplayConfig
from lenpred.studies.whatif import WhatifConfig

app = typer.Typer(help="Predict LLM output length from the serving model's own prefill signals.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
bench_app = typer.Typer(help="Build ForeLen-style benchmarks sampled from a model.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

BENCH_MODEL_HELP = ("Backbone (alias, .gguf file, directory, package shipping a GGUF, hub id) \\[default: the one the "
                    "benchmark was sampled from]; another revision is refused.")
BENCH_HELP = "Benchmark directory (lenpred bench build)."
CACHE_HELP = "Signal cache directory \\[default: under $LENPRED_CACHE]."
LAYERS_HELP = ("Hidden-state layers to extract in full and search (-1 = last) \\[default: depth/2, 3*depth/4 and the "
               "last, rounded down: 15,22,30 on SmolLM2].")
EPOCHS_HELP = "Head training epochs."
POOL_SPAN_HELP = "Pool over: content (the users' text), after_prefix (+ the template suffix) or all."
THREADS_HELP = "torch threads for the backbone and text encoders."


EVALUATE = Options(EvalConfig, {
    "model": BENCH_MODEL_HELP, "bench": BENCH_HELP, "data_dir": DATA_DIR_HELP,
    "out": "Output directory for results.json / .md / .png.", "cache": CACHE_HELP, "layers": LAYERS_HELP,
    "methods": "Predictors to run, in table order.",
    "seeds": "Seeds of the learned predictors (tuned with the first).", "epochs": EPOCHS_HELP,
    "proxy_encoder": "SSJF / S3 text encoder: minilm (packaged) or a local directory.",
    "proxy_epochs": "Fine-tuning epochs of the SSJF / S3 text encoders.",
    "trail_layers": "TRAIL layer sweep \\[default: every layer].", "pool_span": POOL_SPAN_HELP,
    "semantic_divisor": "ESTP semantic score: attention received / n (paper) or / (n - j) ('causal').",
    "binning": "Soft-label bins: log (log-spaced up to the longest length) or quantile.",
    "bootstrap_resamples": "Prompt-clustered bootstrap resamples (95 % intervals).", "threads": THREADS_HELP})
DEMO = EVALUATE.variant(DEMO_DEFAULTS, drop=("proxy_encoder", "proxy_epochs", "trail_layers", "bootstrap_resamples"),
                        seeds=Opt("Head seed.", flag="--seed", default=DEMO_DEFAULTS["seeds"][0], type=int,
                                  convert=lambda seed: (seed,)))
"""`lenpred demo`: `evaluate`'s options with DEMO_DEFAULTS, fewer of them, and one head seed."""


def _evaluate(title: str, cfg: EvalConfig) -> None:
    from rich.console import Console

    from lenpred.studies.evaluate import render_evaluate, run_evaluate

    render_evaluate(run_evaluate(cfg), Console(width=max(Console().width, 100)), title)


@app.command()
@one_line_errors
@with_options(DEMO)
def demo(**options):
    """Train EGTP, ESTP and baselines on a stored benchmark and print the test MAE tables with intervals."""
    _evaluate("demo", EvalConfig(**options))


@app.command()
@one_line_errors
@with_options(EVALUATE)
def evaluate(**options):
    """Every predictor (floors, baselines, poolers, EGTP, ESTP) on the same splits: the comparison tables."""
    _evaluate("evaluate", EvalConfig(**options))


@app.command()
@one_line_errors
@with_options(Options(ProgressiveConfig, {
    "model": BENCH_MODEL_HELP, "bench": BENCH_HELP, "data_dir": DATA_DIR_HELP,
    "out": "Output directory for results.json / .md / curves.png.", "cache": CACHE_HELP,
    "decode_cache": "Decode-state cache directory \\[default: under $LENPRED_CACHE].", "seed": "Head seed.",
    "threads": "torch threads for the backbone (teacher forcing)."}))
def progressive(**options):
    """Progressive remaining-length prediction (PLP, TRAIL-progressive) vs static baselines, per decode step."""
    from rich.console import Console

    from lenpred.studies.progressive import render_progressive, run_progressive

    render_progressive(run_progressive(ProgressiveConfig(**options)), Console())


FIT, FIT_TRAFFIC = LengthPredictor.fit, LengthPredictor.from_traffic
WITH_TRAFFIC = "With --traffic: "
TRAIN = Options(LengthPredictor, {
    "bench": Opt(f"Benchmark directory to train on \\[default: {DEFAULT_BENCH}]; with --traffic, its train split is "
                 "mixed into the logged traffic's training part (none by default).", source=FIT_TRAFFIC),
    "method": "Predictor to train (see `lenpred evaluate --help` for the list); with --traffic, the --base "
              "predictor's method is kept.",
    "out": Opt("Directory to save the predictor in (config.json, predictor.safetensors, CARD.md).", default=...,
               type=str),
    "traffic": unset("Refit on a traffic log directory (lenpred.online.traffic_log): train on its earliest "
                     "requests, calibrate on the next, score the latest.", type=str),
    "base": Opt(WITH_TRAFFIC + "the predictor that served the log (its method, layer and head settings are kept) "
                "\\[default: the shipped predictor].", source=FIT_TRAFFIC),
    "calibration_share": Opt(WITH_TRAFFIC + "share of the log (after the training part, in time order) that "
                             "calibrates the interval.", source=FIT_TRAFFIC),
    "test_share": Opt(WITH_TRAFFIC + "the latest share of the log, scored on the card.", source=FIT_TRAFFIC),
    "finetune": Opt(WITH_TRAFFIC + "train the --base head further instead of refitting from scratch (epochs / "
                    "learning rate chosen in time order).", source=FIT_TRAFFIC),
    "force": Opt(WITH_TRAFFIC + "replace --out whole even when the predictor already there is better on the log's "
                 "latest requests, or cannot be read (refused by default).", default=False, type=bool),
    "model": BENCH_MODEL_HELP, "data_dir": Opt(DATA_DIR_HELP, source=FIT), "cache": Opt(CACHE_HELP, source=FIT),
    "layers": LAYERS_HELP, "coverage": "Nominal coverage of the \\[low, high] interval (calibrated on validation).",
    "seed": "Head seed.", "epochs": EPOCHS_HELP, "pool_span": POOL_SPAN_HELP,
    "threads": Opt(THREADS_HELP, source=FIT)})


@app.command()
@one_line_errors
@with_options(TRAIN)
def train(out: str, traffic: Optional[str], force: bool, **options):
    """Tune a predictor on a benchmark's validation split, calibrate its interval, score test, and save it; or,
    with --traffic, refit a served predictor's head on its logged traffic (a log captured with no head: train the
    model's first head on it alone). With --traffic, a predictor already in --out (the head in service) is scored on
    the same latest requests, and not replaced by a worse head unless --force."""
    from lenpred.pipeline import CONFIG_FILE, render_card

    if not 0 < options["coverage"] < 1:
        raise LenpredError(f"--coverage must lie in (0, 1), got {options['coverage']}")
    out_path = Path(out)
    if any(p.exists() and not p.is_dir() for p in (out_path, *out_path.parents)):  # refused before any work
        raise LenpredError(f"--out {out} is (or lies under) a file: pass a directory")
    fit, refit = TRAIN.take(options, FIT), TRAIN.take(options, FIT_TRAFFIC)
    check_out(out_path, traffic, force)
    if traffic is not None:
        defaults = LengthPredictor().get_params()
        ignored = [n for n, v in options.items() if n in defaults and n != "model"
                   and (tuple(v) if isinstance(v, list) else v) != defaults[n]]
        if ignored:
            raise LenpredError(f"with --traffic the head keeps --base's settings (a log captured with no head: the "
                               f"shipped head's), so {', '.join('--' + n.replace('_', '-') for n in ignored)} would "
                               "be ignored: leave them out")
        incumbent = out if (out_path / CONFIG_FILE).exists() and not force else None
        predictor = LengthPredictor.from_traffic(log=traffic, **refit, **fit, incumbent=incumbent)
        check_not_worse(predictor.card_, out)
    else:
        predictor = LengthPredictor(**options).fit(refit["bench"] or DEFAULT_BENCH, **fit)
    path = predictor.save_pretrained(out)
    typer.echo(render_card(predictor.config_, predictor.card_))
    typer.echo(f"saved to {path}")


def check_out(out: Path, traffic: str | None, force: bool) -> None:
    """Refuse an ``--out`` whose replacement would lose something: a directory holding files but no saved predictor
    (saving replaces the directory whole), one holding an unreadable predictor (unless ``--force``), or, with
    ``--traffic``, the log itself or a directory that holds it; and ``--force`` without ``--traffic``.

    Raises:
        LenpredError: the first of these (the message names ``--out`` and the fix)."""
    from lenpred.predictor_config import read_config

    from lenpred.pipeline import CONFIG_FILE

    if force and traffic is None:
        raise LenpredError("--force is for --traffic (replacing the head in service by a worse one): leave it out")
    if traffic is not None:
        log, target = Path(traffic).resolve(), out.resolve()
        if target == log or target in log.parents:
            raise LenpredError(f"--out {out} is (or holds) the traffic log {traffic}: saving would replace it; pass "
                               "another --out")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / CONFIG_FILE).is_file():
        raise LenpredError(f"--out {out} holds files but no saved predictor, and saving replaces the directory whole: "
                           "pass a new or empty directory")
    try:
        read_config(out)
    except LenpredError as exc:
        if not force:
            raise LenpredError(f"--out {out} holds a predictor that cannot be read ({exc}); pass another --out, or "
                               "--force to replace the directory whole") from None


def check_not_worse(card: dict, out: str) -> None:
    """Refuse to save a traffic-trained head over the predictor in ``out`` when its MAE on the log's latest requests
    is higher (the card's ``mae_minus_incumbent``, :func:`lenpred.traffic_refit.traffic_card`).

    Raises:
        LenpredError: worse; the message gives both MAEs, the paired interval and the fixes."""
    c = card.get("latest traffic", {})
    if "mae_minus_incumbent" not in c or c["mae_minus_incumbent"][0] <= 0:
        return
    d = c["mae_minus_incumbent"]
    ci = "" if d[1] is None else f" [{d[1]:+.1f}, {d[2]:+.1f}]"
    raise LenpredError(f"not saved: on the log's latest {c['n']} requests the new head's MAE is {c['mae']:.1f}, the "
                       f"predictor in service at {out} has {c['incumbent_mae']:.1f} ({d[0]:+.1f}{ci} tokens, paired): "
                       "keep serving it, log more traffic, or pass --force to replace it anyway")


@app.command("traffic-replay")
@one_line_errors
@with_options(Options(TrafficReplayConfig, {
    "bench": "Benchmark whose test split is replayed.",
    "out": "Output directory for results.json / .md and coverage.png.",
    "late": "Scenario or source whose prompts arrive late (the shift).",
    "predictor": "Saved predictor serving the stream \\[default: shipped].", "data_dir": DATA_DIR_HELP,
    "cache": CACHE_HELP, "seed": "Stream order and head seed.",
    "mix_bench": Opt("Also refit on the logged requests plus the benchmark's train split.",
                     flag="--mix-bench/--no-mix-bench")}))
def traffic_replay(**options):
    """Replay a shifted stream through the shipped predictor: fixed vs adaptive interval coverage over time, and a
    head refitted on the logged earlier part vs the shipped one on the later part."""
    from rich.console import Console

    from lenpred.studies.traffic import render_traffic, run_traffic_replay

    render_traffic(run_traffic_replay(TrafficReplayConfig(**options)), Console())


@app.command()
@one_line_errors
@with_options(Options(WhatifConfig, {
    "traffic": "Traffic-log directory to replay (the plug-in's traffic_log or lenpred serve --traffic-log); a "
               "plug-in under policy observe logs traffic in stock's own order.",
    "cost_model": "Cost-model JSON measured on the serving machine \\[default: fitted from the log's timings].",
    "decode_slots": "Concurrency bounds D to replay at, comma-separated; the log's own is added where it says it, "
                    "else the first stands in for it \\[default: the log's own, half and double].",
    "aging_tokens_per_s": "Starvation guard of the lenpred order, tokens per second waited (0: none) \\[default: "
                          "the plug-in's own, from engine.json beside the log, else 0].",
    "max_wait_s": "Age threshold of the lenpred order, s: a request this long past its arrival runs in arrival order "
                  "ahead of the rest; inf: off \\[default: the plug-in's own (engine.json beside the log), else off].",
    "fit_pace": "Scale the cost's step times so the order the log was served in (engine.json beside it), replayed "
                "at its bound, takes the log's mean JCT: the engine's pace while it served the log.",
    "out": "Output directory for whatif.json / .md / .png.",
    "clusters": "Blocks of consecutive arrivals the paired bootstrap resamples.",
    "bootstrap_resamples": "Paired bootstrap resamples.",
    "since": "Replay only requests that arrived at or after this time: ISO 8601 (UTC unless it names an offset) or "
             "epoch seconds \\[default: from the log's start].",
    "until": "Replay only requests that arrived at or before this time (as --since) \\[default: to the log's end].",
    "worth_it": "The smallest mean-JCT cut (a fraction: 0.02 is 2 %) the verdict turns scheduling on for: the lower "
                "end of the cut's interval must be at least this."}))
def whatif(**options):
    """Would length-aware scheduling help this traffic? Replays a traffic log's arrivals, lengths and served
    predictions: stock FCFS vs prompt-length priority vs lenpred vs the recorded length, and a verdict."""
    from lenpred.studies.whatif import render_whatif, run_whatif

    report = run_whatif(WhatifConfig(**options))
    typer.echo(render_whatif(report))
    typer.echo(f"wrote {Path(options['out']) / 'whatif.json'}, whatif.md, whatif.png")


def _read_prompts(prompts: list[str], file: Optional[str]) -> list:
    """Prompts from arguments, a file, or stdin: plain text (one prompt per line) or JSONL with ``prompt`` (a
    string) or ``messages`` (OpenAI-style chat), read by :func:`lenpred.bench.user_prompts.parse_prompt_lines`."""
    import sys
    from pathlib import Path

    from lenpred.bench.user_prompts import parse_prompt_lines

    if prompts and file:
        raise LenpredError("give prompts as arguments or with --file, not both")
    if prompts:
        blank = [i for i, p in enumerate(prompts) if not p.strip()]
        if blank:  # refused before the model loads (seconds), as the prompt path would refuse it after
            raise LenpredError(f"prompt {blank[0]} (counting from 0): empty prompt: give it text")
        return list(prompts)
    if file:
        try:
            text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise LenpredError(f"cannot read --file {file} ({type(exc).__name__}): pass a UTF-8 text or JSONL file")
    elif not sys.stdin.isatty():
        text = sys.stdin.read()
    else:
        raise LenpredError('no prompts: pass them as arguments (lenpred predict "Write a haiku"), with --file, or on '
                           "stdin")
    out = [prompt for _, prompt in parse_prompt_lines(text.splitlines(), file or "stdin")]
    if not out:
        raise LenpredError(f"{file or 'stdin'} holds no prompts")
    return out


@app.command()
@one_line_errors
def predict(
    prompts: Optional[list[str]] = typer.Argument(None, help="Prompts (each one user turn)."),
    predictor: Optional[str] = typer.Option(None, help="Saved predictor directory \\[default: the one shipped]."),
    file: Optional[str] = typer.Option(None, help="Prompts file: text lines or JSONL with prompt / messages; - = stdin."),
    max_new_tokens: Optional[int] = typer.Option(None, help="The requests' generation cap (clips predictions)."),
    scenario: Optional[str] = typer.Option(None, help="Workload the prompts come from, for predictors that read it: "
                                           "one the predictor was trained on (longseq, reasoning or rl for the "
                                           "shipped one)."),
    distribution: bool = typer.Option(False, help="Also print each request's bin distribution."),
    threads: Optional[int] = typer.Option(None, help=THREADS_HELP),
):
    """Predict the output length of prompts: JSONL lines with id, num_prompt_tokens, expected, median, low, high."""
    import json

    from lenpred.pipeline import LengthPredictor

    items = _read_prompts(prompts or [], file)
    if max_new_tokens is not None and max_new_tokens < 1:
        raise LenpredError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if scenario is not None:
        _check_scenario(scenario, predictor)
    model = LengthPredictor.from_pretrained(predictor, threads=threads)
    for i, p in enumerate(model.predict(items, max_new_tokens, scenario, progress=len(items) > 8)):
        typer.echo(json.dumps({"id": i, **p.to_dict(distribution)}))


def _check_scenario(scenario: str, predictor: Optional[str]) -> None:
    """``--scenario`` must be one the predictor was trained and scored on: the rows of its saved test card
    (``longseq``, ``reasoning``, ``rl`` for the shipped predictor; a benchmark of your own prompt files has the
    files' scenario names), or ForeLen's scenarios (:data:`lenpred.bench.sources.SCENARIOS`) when the card lists
    none. Read from ``config.json`` before the model loads; an unreadable directory is left to
    ``LengthPredictor.from_pretrained`` to report."""
    import json

    from lenpred.bench.sources import SCENARIOS
    from lenpred.pipeline import CONFIG_FILE, DEFAULT_PREDICTOR

    path = Path(predictor) if predictor is not None else DEFAULT_PREDICTOR
    try:
        card = json.loads((path / CONFIG_FILE).read_text()).get("card") or {}
    except (OSError, ValueError, AttributeError):
        return  # no readable config: from_pretrained reports the directory
    known = [s for s in card if s != "overall"] if isinstance(card, dict) else []
    known = known or list(SCENARIOS)
    if scenario not in known:
        raise LenpredError(f"unknown scenario '{scenario}'; valid scenarios for this predictor: {', '.join(known)}")


def _file_setting(help: str, flag: Optional[str] = None) -> Opt:
    """A shared setting of the --prompts files: a PromptFileConfig field, not given (None) by default."""
    return unset("--prompts files only: " + help, source=PromptFileConfig, flag=flag)


BUILD = Options(build_benchmark, {
    "out_dir": Opt("Benchmark directory (created, or resumed if it exists).", flag="--out"),
    "preset": unset("Benchmark preset: first, forelen or tiny \\[default: first, unless --prompts or --spec].",
                    type=str),
    "prompts": unset("Your own prompt file instead of a preset (repeatable): one prompt per line, plain text or JSONL "
                     "with 'prompt' (a string) or 'messages' (OpenAI-style chat). Records keep a hash, not the text.",
                     type=list[str]),
    "spec": unset("TOML file with one \\[\\[prompts]] table per prompt file and its own settings (file, name, "
                  "scenario, samples, eval_samples, temperature, top_p, max_new_tokens, num_prompts).", type=str),
    "scenario": _file_setting("scenario name \\[default: the file's name]."),
    "samples_per_prompt": _file_setting("responses per train prompt \\[default: 1].", "--samples"),
    "eval_samples_per_prompt": _file_setting("responses per validation / test prompt \\[default: --samples].",
                                             "--eval-samples"),
    "temperature": _file_setting("sampling temperature \\[default: 0.7]."),
    "top_p": _file_setting("nucleus mass kept \\[default: 1.0 = off]."),
    "max_new_tokens": _file_setting("generation cap \\[default: 512]."),
    "num_prompts": _file_setting("a seeded random subset of this many prompts per file \\[default: all]."),
    "max_prompt_tokens": unset("--prompts / --spec only: leave out longer prompts (counted) \\[default: as long as the "
                               "model's window allows with max_new_tokens].", source=BenchConfig),
    "model": Opt("Model to sample from: default alias, .gguf file, directory, package shipping a GGUF, or hub id.",
                 source=BenchConfig, default=DEFAULT_MODEL),
    "engine": "auto (vLLM if installed), vllm or transformers.",
    "data_dir": Opt("Prompt data sets directory.", type=Optional[str]),
    "max_shards": "Stop after this many new shards.",
    "seed": Opt("Seed of prompt order, splits and per-request seeds.", source=BenchConfig),
    "kv_cache_space_gib": Opt("vLLM only: KV-cache size to reserve, GiB (skips vLLM's check that 92 % of all memory "
                              "is free; 0 = let vLLM size it from --gpu-memory-utilization).", source=VLLMOptions,
                              convert=off_if_empty),
    "gpu_memory_utilization": Opt("vLLM only: share of device memory (on CPU: of host memory) vLLM may take "
                                  "\\[default: vLLM's].", source=VLLMOptions),
    "cpu_threads_bind": Opt("vLLM CPU only: VLLM_CPU_OMP_THREADS_BIND: auto, nobind (other work shares the cores) or a "
                            "core list like 0-1 \\[default: the environment's, else auto].", source=VLLMOptions),
    "cpu_reserved_cores": Opt("vLLM CPU only: cores kept for vLLM's scheduler (VLLM_CPU_NUM_OF_RESERVED_CPU) "
                              "\\[default: 0].", source=VLLMOptions)})


@bench_app.command("build")
@one_line_errors
@with_options(BUILD)
def bench_build(preset: Optional[str], prompts: Optional[list[str]], spec: Optional[str], **options):
    """Sample a benchmark from a preset or your own prompt files (resumable: rerun the same command to continue
    where it stopped)."""
    settings, bench = BUILD.take(options, PromptFileConfig), BUILD.take(options, BenchConfig)
    config = _bench_config(preset, prompts or [], spec, settings, bench["max_prompt_tokens"], bench["model"])
    config.seed = bench["seed"]
    vllm_options = VLLMOptions(**BUILD.take(options, VLLMOptions))
    path = build_benchmark(config=config, **options, vllm_options=vllm_options)
    typer.echo(f"benchmark in {path}")


def _bench_config(preset: Optional[str], prompts: list[str], spec: Optional[str], settings: dict,
                  max_prompt_tokens: Optional[int], model: str):
    """The benchmark config of `bench build`: a preset, or the prompt files of --prompts (with the shared settings)
    and --spec (each with its own)."""
    from lenpred.bench.plan import preset as make_preset
    from lenpred.bench.user_prompts import PromptFileConfig, load_prompt_spec

    given = sorted("--" + k.replace("_per_prompt", "").replace("_", "-") for k, v in settings.items() if v is not None)
    if not prompts and not spec:
        if given or max_prompt_tokens is not None:
            raise LenpredError(f"{', '.join(given) or '--max-prompt-tokens'} set the sampling of --prompts files; a "
                               "preset keeps its own settings")
        return make_preset(preset or "first", model)
    if preset is not None:
        raise LenpredError("give --preset or your own --prompts / --spec, not both")
    if given and not prompts:
        raise LenpredError(f"{', '.join(given)} apply to --prompts files; set them per file in the --spec file")
    chosen = {k: v for k, v in settings.items() if v is not None}
    files = [PromptFileConfig(path=path, **chosen) for path in prompts] + (load_prompt_spec(spec) if spec else [])
    return BenchConfig(model=model, scenarios={}, max_prompt_tokens=max_prompt_tokens, prompt_files=files)


@bench_app.command("card")
@one_line_errors
def bench_card(bench: str = typer.Argument(..., help="Benchmark directory.")):
    """Write the dataset card (CARD.md, card.json, card.png) next to the benchmark's shards."""
    from lenpred.bench.card import write_card

    paths = write_card(bench)
    typer.echo(paths["md"].read_text())
    typer.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


app.add_typer(schedule_app, name="schedule")  # lenpred schedule ... (lenpred.cli_schedule)


# ---- lenpred serve (issue 13, part B) -------------------------------------------------------------------------------
SERVE = Options(run_proxy, {
    "upstream": "OpenAI-compatible server, e.g. http://127.0.0.1:8000 (vllm serve --scheduling-policy priority).",
    "host": "Address to bind (loopback by default).", "port": "Port to listen on.",
    "predictor": "Saved predictor directory \\[default: the one shipped].",
    "threads": "torch threads for predictions (leave the other cores to the engine).",
    "max_connections": "Upstream connections at most (keep it above the engine's concurrency); waits are recorded.",
    "default_max_tokens": "max_tokens sent when a request has none (tokens).",
    "window_ms": Opt("How long the idle predictor waits for a batch to fill (ms).", flag="--batch-window-ms",
                     source=BatchConfig),
    "max_batch_tokens": Opt("Prompt tokens per prediction batch.", source=BatchConfig),
    "truncated": Opt("Stop the predictor's forward at the layer it reads (hidden-state-only predictors).",
                     flag="--truncated/--full-prefill"),
    "traffic_log": "Log every answered request (the head's input features, the prediction, the observed length; no "
                   "text) to this directory, for `lenpred train --traffic` \\[default: off].",
    "adaptive_interval": "Adapt the served interval online: aci or rolling \\[default: off, the predictor's fixed "
                         "margin].",
    "group_header": "Request header naming the request's group (route, client): the adaptive interval is calibrated "
                    "per group.",
    "aging_tokens_per_s": "Starvation guard: each second a request has waited counts as this many tokens off its "
                          "priority (0: off; the tail-vs-mean trade-off: docs/scheduling.md)."})


@app.command()
@one_line_errors
@with_options(SERVE)
def serve(**options):
    """OpenAI-compatible proxy: predicts each request's output length and forwards it with vLLM's `priority`."""
    batch = BatchConfig(**SERVE.take(options, BatchConfig))
    run_proxy(**options, batch=batch, on_ready=typer.echo)


@app.command()
@one_line_errors
@with_options(Options(DiagnoseConfig, {
    "model": BENCH_MODEL_HELP, "bench": BENCH_HELP, "data_dir": DATA_DIR_HELP, "cache": CACHE_HELP,
    "evaluate": "lenpred evaluate output to read.", "out": "Output directory for REPORT.md, PNGs and JSON.",
    "sections": "Sections to compute; the others are re-rendered from OUT if present.",
    "skip": Opt("Sections to leave out of --sections (e.g. overhead,ablation for speed).", default="",
                type=tuple[str, ...]),
    "attribution_prompts": "Test prompts per scenario for the gradient attribution.",
    "pruned_ks": "Pruned output-vocabulary sizes scored offline.",
    "overhead_k": "Pruned vocabulary size timed in the overhead section.",
    "seeds": "Head seeds (ablation headline, cheaper entropy).",
    "max_batch_tokens": "Overhead: skip batches with more prompt tokens (CPU time).",
    "overhead_repeats": "Overhead: timed runs per variant (fastest counts).",
    "overhead_batch_sizes": "Overhead: batch sizes.", "overhead_lengths": "Overhead: prompt lengths (tokens).",
    "threads": THREADS_HELP}))
def diagnose(sections: tuple[str, ...], skip: tuple[str, ...], **options):
    """Diagnostics: entropy/semantic misalignment, gradient attribution, ablations, a cheaper entropy and the
    signals' overhead; writes OUT/REPORT.md (+ PNGs, diagnose.json). Time it on an otherwise idle machine."""
    from rich.console import Console

    from lenpred.studies.diagnose.run import render_diagnose, run_diagnose

    cfg = DiagnoseConfig(sections=tuple(s for s in sections if s not in skip), **options)
    render_diagnose(run_diagnose(cfg), Console())


if __name__ == "__main__":  # vLLM spawns an engine process: the guard is required
    app()
