"""``lenpred <command>``: each command builds a config and calls one library function.

A :class:`lenpred.LenpredError` (bad input the user can fix) is printed as one line and exits 2.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from lenpred.backbone import DEFAULT_MODEL
from lenpred.bench.build import build_benchmark
from lenpred.bench.plan import BenchConfig
from lenpred.engines import VLLMOptions
from lenpred.errors import LenpredError
from lenpred.pipeline import LengthPredictor
from lenpred.serving.proxy.app import serve as run_proxy
from lenpred.serving.proxy.batching import BatchConfig
from lenpred.studies import DEFAULT_BENCH
from lenpred.studies.diagnose.config import DiagnoseConfig
from lenpred.studies.evaluate import DEMO_DEFAULTS, EvalConfig
from lenpred.studies.progressive import ProgressiveConfig
from lenpred.studies.simulate import SimExperimentConfig
from lenpred.studies.static_run import CalibrationConfig, StaticRunConfig
from lenpred.studies.traffic import TrafficReplayConfig
from lenpred.studies.vllm_offline import VLLMOfflineConfig
from lenpred.studies.vllm_serve import VLLMServeConfig
from lenpred.studies.workload import WorkloadConfig

app = typer.Typer(help="Predict LLM output length from the serving model's own prefill signals.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
bench_app = typer.Typer(help="Build ForeLen-style benchmarks sampled from a model.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


class _StderrHandler(logging.StreamHandler):
    """Log records as plain lines on whatever ``sys.stderr`` is at the time (a test runner swaps it)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def log_to_stderr() -> None:
    """Show the package's progress (INFO) and warnings on stderr: the library logs, the CLI shows (idempotent)."""
    log = logging.getLogger("lenpred")
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        log.addHandler(_StderrHandler())
    log.setLevel(logging.INFO)


def one_line_errors(fn):
    """Turn :class:`LenpredError` into ``error: <message>`` on stderr and exit status 2 (and show the package's log
    records on stderr while the command runs: :func:`log_to_stderr`)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        log_to_stderr()
        try:
            return fn(*args, **kwargs)
        except LenpredError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    return wrapper


def _ints(option: str, text: Optional[str]) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise LenpredError(f"{option} takes comma-separated integers (e.g. 0,1,2), got '{text}'") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


def default_of(source: Any, name: str, overrides: Optional[dict] = None) -> Any:
    """The default of ``name`` as a CLI option shows it: ``overrides[name]`` if given, else the field's default of
    a config dataclass (its ``default_factory()`` value), or the parameter's default of a function or class
    signature. Tuples become comma-separated text (the options parse them back with :func:`_ints` / :func:`_names`).

    Raises:
        KeyError: ``source`` has no field or parameter ``name``, or it has no default.
    """
    if overrides and name in overrides:
        value = overrides[name]
    elif dataclasses.is_dataclass(source):
        field = {f.name: f for f in dataclasses.fields(source)}[name]
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            raise KeyError(f"{source.__name__}.{name} has no default")
    else:
        value = inspect.signature(source).parameters[name].default
        if value is inspect.Parameter.empty:
            raise KeyError(f"{source!r} parameter {name} has no default")
    return ",".join(str(v) for v in value) if isinstance(value, tuple) else value


class Defaults:
    """Options whose defaults come from one config (one default per option: the config's).

    ``Defaults(EvalConfig)("epochs", help=...)`` is ``typer.Option(<EvalConfig.epochs default>, help=...)``;
    ``field`` names the config field when the option's name differs (``--evaluate`` -> ``evaluate``).
    """

    def __init__(self, source: Any, overrides: Optional[dict] = None):
        self.source, self.overrides = source, overrides or {}

    def __call__(self, name: str, *param_decls: str, **kwargs):
        return typer.Option(default_of(self.source, name, self.overrides), *param_decls, **kwargs)


EVAL, DEMO = Defaults(EvalConfig), Defaults(EvalConfig, DEMO_DEFAULTS)
MODEL_HELP = "Backbone: default alias, .gguf file, directory, package shipping a GGUF, or hub id."
BENCH_MODEL_HELP = ("Backbone (alias, .gguf file, directory, package shipping a GGUF, hub id) \\[default: the one the "
                    "benchmark was sampled from]; another revision is refused.")
BENCH_HELP = "Benchmark directory (lenpred bench build)."
DATA_DIR_HELP = "Prompt data sets \\[default: $LENPRED_DATA_DIR or ../shared/datasets]."
CACHE_HELP = "Signal cache directory \\[default: under $LENPRED_CACHE]."
LAYERS_HELP = ("Hidden-state layers to extract in full and search (-1 = last) \\[default: depth/2, 3*depth/4 and the "
               "last, rounded down: 15,22,30 on SmolLM2].")
EPOCHS_HELP = "Head training epochs."
POOL_SPAN_HELP = "Pool over: content (the users' text), after_prefix (+ the template suffix) or all."
DIVISOR_HELP = "ESTP semantic score: attention received / n (paper) or / (n - j) ('causal')."
BINNING_HELP = "Soft-label bins: log (log-spaced up to the longest length) or quantile."
THREADS_HELP = "torch threads for the backbone and text encoders."
WORKLOAD_HELP = "Prediction table of `lenpred schedule predictions` (its --out)."
PREDICTORS_DIR_HELP = "Saved predictors the table was built from (`lenpred evaluate`'s OUT/predictors)."


def _evaluate(title: str, **kwargs) -> None:
    from rich.console import Console

    from lenpred.studies.evaluate import render_evaluate, run_evaluate

    render_evaluate(run_evaluate(EvalConfig(**kwargs)), Console(width=max(Console().width, 100)), title)


@app.command()
@one_line_errors
def demo(
    model: Optional[str] = DEMO("model", help=BENCH_MODEL_HELP),
    bench: str = DEMO("bench", help=BENCH_HELP),
    data_dir: Optional[str] = DEMO("data_dir", help=DATA_DIR_HELP),
    out: str = DEMO("out", help="Output directory for results.json / .md / .png."),
    cache: Optional[str] = DEMO("cache", help=CACHE_HELP),
    layers: Optional[str] = DEMO("layers", help=LAYERS_HELP),
    methods: str = DEMO("methods", help="Predictors to run."),
    epochs: int = DEMO("epochs", help=EPOCHS_HELP),
    seed: int = typer.Option(DEMO_DEFAULTS["seeds"][0], help="Head seed."),
    pool_span: str = DEMO("pool_span", help=POOL_SPAN_HELP),
    semantic_divisor: str = DEMO("semantic_divisor", help=DIVISOR_HELP),
    binning: str = DEMO("binning", help=BINNING_HELP),
    threads: Optional[int] = DEMO("threads", help=THREADS_HELP),
):
    """Train EGTP, ESTP and baselines on a stored benchmark and print the test MAE tables with intervals."""
    _evaluate("demo", model=model, bench=bench, data_dir=data_dir, out=out, cache=cache,
              layers=_ints("--layers", layers), methods=_names(methods), epochs=epochs, seeds=(seed,),
              pool_span=pool_span, semantic_divisor=semantic_divisor, binning=binning, threads=threads)


@app.command()
@one_line_errors
def evaluate(
    model: Optional[str] = EVAL("model", help=BENCH_MODEL_HELP),
    bench: str = EVAL("bench", help=BENCH_HELP),
    data_dir: Optional[str] = EVAL("data_dir", help=DATA_DIR_HELP),
    out: str = EVAL("out", help="Output directory for results.json / .md / .png."),
    cache: Optional[str] = EVAL("cache", help=CACHE_HELP),
    layers: Optional[str] = EVAL("layers", help=LAYERS_HELP),
    methods: str = EVAL("methods", help="Predictors to run, in table order."),
    seeds: str = EVAL("seeds", help="Seeds of the learned predictors (tuned with the first)."),
    epochs: int = EVAL("epochs", help=EPOCHS_HELP),
    proxy_encoder: str = EVAL("proxy_encoder", help="SSJF / S3 text encoder: minilm (packaged) or a local directory."),
    proxy_epochs: int = EVAL("proxy_epochs", help="Fine-tuning epochs of the SSJF / S3 text encoders."),
    trail_layers: Optional[str] = EVAL("trail_layers", help="TRAIL layer sweep \\[default: every layer]."),
    pool_span: str = EVAL("pool_span", help=POOL_SPAN_HELP),
    semantic_divisor: str = EVAL("semantic_divisor", help=DIVISOR_HELP),
    binning: str = EVAL("binning", help=BINNING_HELP),
    bootstrap_resamples: int = EVAL("bootstrap_resamples", help="Prompt-clustered bootstrap resamples (95 % intervals)."),
    threads: Optional[int] = EVAL("threads", help=THREADS_HELP),
):
    """Every predictor (floors, baselines, poolers, EGTP, ESTP) on the same splits: the comparison tables."""
    _evaluate("evaluate", model=model, bench=bench, data_dir=data_dir, out=out, cache=cache,
              layers=_ints("--layers", layers), methods=_names(methods), seeds=_ints("--seeds", seeds),
              epochs=epochs, proxy_encoder=proxy_encoder, proxy_epochs=proxy_epochs,
              trail_layers=None if trail_layers is None else _ints("--trail-layers", trail_layers),
              pool_span=pool_span, semantic_divisor=semantic_divisor, binning=binning,
              bootstrap_resamples=bootstrap_resamples, threads=threads)


PROG = Defaults(ProgressiveConfig)


@app.command()
@one_line_errors
def progressive(
    model: Optional[str] = PROG("model", help=BENCH_MODEL_HELP),
    bench: str = PROG("bench", help=BENCH_HELP),
    data_dir: Optional[str] = PROG("data_dir", help=DATA_DIR_HELP),
    out: str = PROG("out", help="Output directory for results.json / .md / curves.png."),
    cache: Optional[str] = PROG("cache", help=CACHE_HELP),
    decode_cache: Optional[str] = PROG("decode_cache", help="Decode-state cache directory \\[default: under "
                                       "$LENPRED_CACHE]."),
    seed: int = PROG("seed", help="Head seed."),
    threads: Optional[int] = PROG("threads", help="torch threads for the backbone (teacher forcing)."),
):
    """Progressive remaining-length prediction (PLP, TRAIL-progressive) vs static baselines, per decode step."""
    from rich.console import Console

    from lenpred.studies.progressive import render_progressive, run_progressive

    render_progressive(run_progressive(ProgressiveConfig(model=model, bench=bench, data_dir=data_dir, out=out,
                                                         cache=cache, decode_cache=decode_cache, seed=seed,
                                                         threads=threads)), Console())


FIT, TRAFFIC_FIT = Defaults(LengthPredictor), Defaults(LengthPredictor.from_traffic)


@app.command()
@one_line_errors
def train(
    bench: Optional[str] = typer.Option(None, help=f"Benchmark directory to train on \\[default: {DEFAULT_BENCH}]; "
                                        "with --traffic, its train split is mixed into the logged traffic's training "
                                        "part (none by default)."),
    method: str = FIT("method", help="Predictor to train (see `lenpred evaluate --help` for the list); with "
                      "--traffic, the --base predictor's method is kept."),
    out: str = typer.Option(..., help="Directory to save the predictor in (config.json, predictor.safetensors, CARD.md)."),
    traffic: Optional[str] = typer.Option(None, help="Refit on a traffic log directory (lenpred.online.traffic_log): "
                                          "train on its earliest requests, calibrate on the next, score the latest."),
    base: Optional[str] = TRAFFIC_FIT("base", help="With --traffic: the predictor that served the log (its method, "
                                      "layer and head settings are kept) \\[default: the shipped predictor]."),
    calibration_share: float = TRAFFIC_FIT("calibration_share", help="With --traffic: share of the log (after the "
                                           "training part, in time order) that calibrates the interval."),
    test_share: float = TRAFFIC_FIT("test_share", help="With --traffic: the latest share of the log, scored on the "
                                    "card."),
    finetune: bool = TRAFFIC_FIT("finetune", help="With --traffic: train the --base head further instead of refitting "
                                 "from scratch (epochs / learning rate chosen in time order)."),
    model: Optional[str] = FIT("model", help=BENCH_MODEL_HELP),
    data_dir: Optional[str] = typer.Option(None, help=DATA_DIR_HELP),
    cache: Optional[str] = typer.Option(None, help=CACHE_HELP),
    layers: Optional[str] = FIT("layers", help=LAYERS_HELP),
    coverage: float = FIT("coverage", help="Nominal coverage of the \\[low, high] interval (calibrated on validation)."),
    seed: int = FIT("seed", help="Head seed."),
    epochs: int = FIT("epochs", help=EPOCHS_HELP),
    pool_span: str = FIT("pool_span", help=POOL_SPAN_HELP),
    threads: Optional[int] = typer.Option(None, help=THREADS_HELP),
):
    """Tune a predictor on a benchmark's validation split, calibrate its interval, score test, and save it; or,
    with --traffic, refit a served predictor's head on its logged traffic."""
    from lenpred.pipeline import render_card

    if not 0 < coverage < 1:
        raise LenpredError(f"--coverage must lie in (0, 1), got {coverage}")
    out_path = Path(out)
    if any(p.exists() and not p.is_dir() for p in (out_path, *out_path.parents)):  # refused before any work
        raise LenpredError(f"--out {out} is (or lies under) a file: pass a directory")
    if traffic is not None:
        predictor = LengthPredictor.from_traffic(traffic, bench, base, calibration_share, test_share, finetune,
                                                 data_dir=data_dir, cache=cache, threads=threads)
    else:
        predictor = LengthPredictor(method, model, _ints("--layers", layers), coverage, seed, epochs,
                                    pool_span=pool_span)
        predictor.fit(bench or DEFAULT_BENCH, data_dir=data_dir, cache=cache, threads=threads)
    path = predictor.save_pretrained(out)
    typer.echo(render_card(predictor.config_, predictor.card_))
    typer.echo(f"saved to {path}")


TRAFFIC = Defaults(TrafficReplayConfig)


@app.command("traffic-replay")
@one_line_errors
def traffic_replay(
    bench: str = TRAFFIC("bench", help="Benchmark whose test split is replayed."),
    out: str = TRAFFIC("out", help="Output directory for results.json / .md and coverage.png."),
    late: str = TRAFFIC("late", help="Scenario or source whose prompts arrive late (the shift)."),
    predictor: Optional[str] = TRAFFIC("predictor", help="Saved predictor serving the stream \\[default: shipped]."),
    data_dir: Optional[str] = TRAFFIC("data_dir", help=DATA_DIR_HELP),
    cache: Optional[str] = TRAFFIC("cache", help=CACHE_HELP),
    seed: int = TRAFFIC("seed", help="Stream order and head seed."),
    mix_bench: bool = TRAFFIC("mix_bench", "--mix-bench/--no-mix-bench",
                              help="Also refit on the logged requests plus the benchmark's train split."),
):
    """Replay a shifted stream through the shipped predictor: fixed vs adaptive interval coverage over time, and a
    head refitted on the logged earlier part vs the shipped one on the later part."""
    from rich.console import Console

    from lenpred.studies.traffic import render_traffic, run_traffic_replay

    render_traffic(run_traffic_replay(TrafficReplayConfig(bench=bench, out=out, late=late, predictor=predictor,
                                                          data_dir=data_dir, cache=cache, seed=seed,
                                                          mix_bench=mix_bench)), Console())


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


FILES_ONLY = "--prompts files only: "
BUILD, BENCH_CONFIG, VLLM_OPTIONS = Defaults(build_benchmark), Defaults(BenchConfig), Defaults(VLLMOptions)


@bench_app.command("build")
@one_line_errors
def bench_build(
    out: str = typer.Option(..., help="Benchmark directory (created, or resumed if it exists)."),
    preset: Optional[str] = typer.Option(None, help="Benchmark preset: first, forelen or tiny \\[default: first, "
                                         "unless --prompts or --spec]."),
    prompts: Optional[list[str]] = typer.Option(
        None, help="Your own prompt file instead of a preset (repeatable): one prompt per line, plain text or JSONL "
                   "with 'prompt' (a string) or 'messages' (OpenAI-style chat). Records keep a hash, not the text."),
    spec: Optional[str] = typer.Option(
        None, help="TOML file with one \\[\\[prompts]] table per prompt file and its own settings (file, name, "
                   "scenario, samples, eval_samples, temperature, top_p, max_new_tokens, num_prompts)."),
    scenario: Optional[str] = typer.Option(None, help=FILES_ONLY + "scenario name \\[default: the file's name]."),
    samples: Optional[int] = typer.Option(None, help=FILES_ONLY + "responses per train prompt \\[default: 1]."),
    eval_samples: Optional[int] = typer.Option(
        None, help=FILES_ONLY + "responses per validation / test prompt \\[default: --samples]."),
    temperature: Optional[float] = typer.Option(None, help=FILES_ONLY + "sampling temperature \\[default: 0.7]."),
    top_p: Optional[float] = typer.Option(None, help=FILES_ONLY + "nucleus mass kept \\[default: 1.0 = off]."),
    max_new_tokens: Optional[int] = typer.Option(None, help=FILES_ONLY + "generation cap \\[default: 512]."),
    num_prompts: Optional[int] = typer.Option(None, help=FILES_ONLY + "a seeded random subset of this many prompts "
                                              "per file \\[default: all]."),
    max_prompt_tokens: Optional[int] = typer.Option(
        None, help="--prompts / --spec only: leave out longer prompts (counted) \\[default: as long as the model's "
                   "window allows with max_new_tokens]."),
    model: str = typer.Option(DEFAULT_MODEL, help="Model to sample from: default alias, .gguf file, directory, "
                              "package shipping a GGUF, or hub id."),
    engine: str = BUILD("engine", help="auto (vLLM if installed), vllm or transformers."),
    data_dir: Optional[str] = BUILD("data_dir", help="Prompt data sets directory."),
    max_shards: Optional[int] = BUILD("max_shards", help="Stop after this many new shards."),
    seed: int = BENCH_CONFIG("seed", help="Seed of prompt order, splits and per-request seeds."),
    kv_cache_space_gib: float = VLLM_OPTIONS("kv_cache_space_gib", help="vLLM only: KV-cache size to reserve, GiB "
                                             "(skips vLLM's check that 92 % of all memory is free; 0 = let vLLM size "
                                             "it from --gpu-memory-utilization)."),
    gpu_memory_utilization: Optional[float] = typer.Option(
        None, help="vLLM only: share of device memory (on CPU: of host memory) vLLM may take \\[default: vLLM's]."),
    cpu_threads_bind: Optional[str] = typer.Option(
        None, help="vLLM CPU only: VLLM_CPU_OMP_THREADS_BIND: auto, nobind (other work shares the cores) or a "
                   "core list like 0-1 \\[default: the environment's, else auto]."),
    cpu_reserved_cores: Optional[int] = typer.Option(
        None, help="vLLM CPU only: cores kept for vLLM's scheduler (VLLM_CPU_NUM_OF_RESERVED_CPU) \\[default: 0]."),
):
    """Sample a benchmark from a preset or your own prompt files (resumable: rerun the same command to continue
    where it stopped)."""
    settings = {"scenario": scenario, "samples_per_prompt": samples, "eval_samples_per_prompt": eval_samples,
                "temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens,
                "num_prompts": num_prompts}
    config = _bench_config(preset, prompts or [], spec, settings, max_prompt_tokens, model)
    config.seed = seed
    options = VLLMOptions(kv_cache_space_gib=kv_cache_space_gib or None, gpu_memory_utilization=gpu_memory_utilization,
                          cpu_threads_bind=cpu_threads_bind, cpu_reserved_cores=cpu_reserved_cores)
    path = build_benchmark(config, out, engine=engine, data_dir=data_dir, max_shards=max_shards, vllm_options=options)
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
    files = [PromptFileConfig(path, **chosen) for path in prompts] + (load_prompt_spec(spec) if spec else [])
    return BenchConfig(model, {}, max_prompt_tokens=max_prompt_tokens, prompt_files=files)


@bench_app.command("card")
@one_line_errors
def bench_card(bench: str = typer.Argument(..., help="Benchmark directory.")):
    """Write the dataset card (CARD.md, card.json, card.png) next to the benchmark's shards."""
    from lenpred.bench.card import write_card

    paths = write_card(bench)
    typer.echo(paths["md"].read_text())
    typer.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


# ---- lenpred schedule (issue 13): length-aware scheduling -----------------------------------------------------------
schedule_app = typer.Typer(help="Length-aware scheduling: workload predictions, cost-model calibration, simulator, "
                                "real runs and their report.", no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")
WORKLOAD, CALIBRATE, SIM, STATIC = (Defaults(WorkloadConfig), Defaults(CalibrationConfig),
                                   Defaults(SimExperimentConfig), Defaults(StaticRunConfig))


@schedule_app.command("predictions")
@one_line_errors
def schedule_predictions(
    predictors: str = WORKLOAD("predictors", help="Saved predictors to run on the test split."),
    predictors_dir: str = WORKLOAD("predictors_dir", help="Where `lenpred evaluate` saved them."),
    bench: str = WORKLOAD("bench", help="Benchmark directory."),
    out: str = WORKLOAD("out", help="Cached prediction table."),
):
    """Predict every test request's length with each saved predictor (cached with a checksum; reruns reuse it)."""
    from lenpred.studies.workload import load_workload_table

    table = load_workload_table(out, bench, predictors_dir, _names(predictors), token_ids=False)
    typer.echo(f"{table.num_rows} test requests with predictions of {', '.join(_names(predictors))} in {out}")


@schedule_app.command("calibrate")
@one_line_errors
def schedule_calibrate(
    model: str = CALIBRATE("model", help=MODEL_HELP),
    batch_sizes: str = CALIBRATE("batch_sizes", help="Batch sizes measured."),
    prompt_tokens: str = CALIBRATE("prompt_tokens", help="Prompt lengths measured (random token ids)."),
    new_tokens: str = CALIBRATE("new_tokens", help="Generated tokens per run (1 = prefill only)."),
    repeats: int = CALIBRATE("repeats", help="Timed repeats per point (median kept)."),
    threads: int = CALIBRATE("threads", help="torch threads (time it on an otherwise idle machine)."),
    out: str = CALIBRATE("out", help="Cost model JSON."),
):
    """Time transformers `generate` on a grid and fit the simulator's cost model (prefill and decode-step time)."""
    from lenpred.studies.static_run import calibrate_transformers

    model_ = calibrate_transformers(CalibrationConfig(model, _ints("--batch-sizes", batch_sizes),
                                                      _ints("--prompt-tokens", prompt_tokens),
                                                      _ints("--new-tokens", new_tokens), repeats, threads, out=out))
    typer.echo(f"{model_.coefficients} fit {model_.fit_stats} → {out}")


@schedule_app.command("simulate")
@one_line_errors
def schedule_simulate(
    cost_model: str = SIM("cost_model", help="Calibrated cost model."),
    predictors: str = SIM("predictors", help="Predictors ranking requests (+ oracle)."),
    num_requests: int = SIM("num_requests", help="Requests per workload draw."),
    draws: int = SIM("draws", help="Workload draws (bootstrap over draws)."),
    max_num_seqs: int = SIM("max_num_seqs", help="Concurrency limit (continuous) and static batch size."),
    max_num_batched_tokens: int = SIM("max_num_batched_tokens", help="Token budget per step (continuous)."),
    arrivals: str = SIM("arrivals", help="Arrival processes: all, poisson, gamma."),
    load: float = SIM("load", help="Arrival rate as a share of the FCFS all-at-once throughput (req/s)."),
    cv: float = SIM("cv", help="Gamma inter-arrival coefficient of variation."),
    aging_steps: int = SIM("aging_steps", help="vllm-ltr starvation guard for the +aging rows (0 = none)."),
    seed: int = SIM("seed", help="First workload / arrival seed."),
    progressive: str = SIM("progressive", help="`lenpred progressive`'s test_estimates.parquet: srpt rows driven by "
                           "its re-predictions (a missing file or '' = none)."),
    workload: str = SIM("workload", help=WORKLOAD_HELP),
    bench: str = SIM("bench", help="Benchmark the table was built from."),
    predictors_dir: str = SIM("predictors_dir", help=PREDICTORS_DIR_HELP),
    out: str = SIM("out", help="Output directory."),
):
    """Simulate every policy × predictor on many workload draws; table, PNGs and JSON."""
    from rich.console import Console

    from lenpred.studies.simulate import run_simulation
    from lenpred.studies.scheduling_report import save_simulation_report

    cfg = SimExperimentConfig(cost_model, _names(predictors), num_requests, draws, max_num_seqs,
                              max_num_batched_tokens, _names(arrivals), load, cv, aging_steps or None, seed=seed,
                              out=out, progressive=progressive or None, workload=workload, bench=bench,
                              predictors_dir=predictors_dir)
    paths = save_simulation_report(run_simulation(cfg).to_dict(), out, Console(width=max(Console().width, 200)))
    typer.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


@schedule_app.command("run-static")
@one_line_errors
def schedule_run_static(
    model: str = STATIC("model", help=MODEL_HELP),
    num_requests: int = STATIC("num_requests", help="Requests drawn from the test split."),
    batch_size: int = STATIC("batch_size", help="Static batch size."),
    max_output_len: int = STATIC("max_output_len", help="Only requests whose true length is at most this (tokens)."),
    seed: int = STATIC("seed", help="Workload draw seed."),
    groupings: str = STATIC("groupings", help="Batch groupings (policies)."),
    cost_model: str = STATIC("cost_model", help="Calibrated cost model."),
    out: str = STATIC("out", help="Result JSON (resumes per grouping)."),
    threads: int = STATIC("threads", help="torch threads (time it on an otherwise idle machine)."),
    workload: str = STATIC("workload", help=WORKLOAD_HELP),
    bench: str = STATIC("bench", help="Benchmark the table was built from (the prompts are re-read from it)."),
    predictors_dir: str = STATIC("predictors_dir", help=PREDICTORS_DIR_HELP),
):
    """Real run 1: static batches with transformers generate, each request forced to its true length; measured
    wall time, padding and tok/s vs the simulator's prediction."""
    from rich.console import Console

    from lenpred.studies.scheduling_report import save_static_real_report
    from lenpred.studies.static_run import run_static

    report = run_static(StaticRunConfig(model, num_requests, batch_size, max_output_len, seed, _names(groupings),
                                        cost_model, out, threads, workload=workload, bench=bench,
                                        predictors_dir=predictors_dir))
    paths = save_static_real_report(report.to_dict(), Path(out).parent, Console(width=max(Console().width, 160)))
    typer.echo(f"wrote {out}, {', '.join(str(p) for p in paths.values())}")


@schedule_app.command("report")
@one_line_errors
def schedule_report(out: str = SIM("out", help="Directory holding the runs' JSON files.")):
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


# ---- lenpred serve and the vLLM real runs (issue 13, part B) -------------------------------------------------------
PROXY, BATCH = Defaults(run_proxy), Defaults(BatchConfig)


@app.command()
@one_line_errors
def serve(
    upstream: str = typer.Option(..., help="OpenAI-compatible server, e.g. http://127.0.0.1:8000 (vllm serve "
                                           "--scheduling-policy priority)."),
    host: str = PROXY("host", help="Address to bind (loopback by default)."),
    port: int = PROXY("port", help="Port to listen on."),
    predictor: Optional[str] = PROXY("predictor", help="Saved predictor directory \\[default: the one shipped]."),
    threads: int = PROXY("threads", help="torch threads for predictions (leave the other cores to the engine)."),
    max_connections: int = PROXY("max_connections", help="Upstream connections at most (keep it above the engine's "
                                 "concurrency); waits are recorded."),
    default_max_tokens: int = PROXY("default_max_tokens", help="max_tokens sent when a request has none (tokens)."),
    batch_window_ms: float = BATCH("window_ms", help="How long the idle predictor waits for a batch to fill (ms)."),
    max_batch_tokens: int = BATCH("max_batch_tokens", help="Prompt tokens per prediction batch."),
    truncated: bool = PROXY("truncated", "--truncated/--full-prefill", help="Stop the predictor's forward at the "
                            "layer it reads (hidden-state-only predictors)."),
    traffic_log: Optional[str] = PROXY("traffic_log", help="Log every answered request (the head's input "
                                       "features, the prediction, the observed length; no text) to this directory, "
                                       "for `lenpred train --traffic` \\[default: off]."),
    adaptive_interval: Optional[str] = PROXY("adaptive_interval", help="Adapt the served interval online: aci or "
                                             "rolling \\[default: off, the predictor's fixed margin]."),
    group_header: Optional[str] = PROXY("group_header", help="Request header naming the request's group (route, "
                                        "client): the adaptive interval is calibrated per group."),
):
    """OpenAI-compatible proxy: predicts each request's output length and forwards it with vLLM's `priority`."""
    batch = BatchConfig(window_ms=batch_window_ms, max_batch_tokens=max_batch_tokens)
    run_proxy(upstream, host, port, predictor, threads, max_connections=max_connections,
              default_max_tokens=default_max_tokens, batch=batch, truncated=truncated, traffic_log=traffic_log,
              adaptive_interval=adaptive_interval, group_header=group_header,
              on_ready=lambda message: typer.echo(message))


OFFLINE, VSERVE = Defaults(VLLMOfflineConfig), Defaults(VLLMServeConfig)


@schedule_app.command("vllm-offline")
@one_line_errors
def schedule_vllm_offline(
    num_requests: int = OFFLINE("num_requests", help="Requests per workload draw."),
    draws: int = OFFLINE("draws", help="Workload draws (bootstrap over draws)."),
    seed: int = OFFLINE("seed", help="First workload seed."),
    max_output_len: int = OFFLINE("max_output_len", help="Only requests whose true length is at most this (tokens)."),
    max_num_seqs: int = OFFLINE("max_num_seqs", help="vLLM concurrency limit (small, so requests queue)."),
    predictors: str = OFFLINE("predictors", help="Predictors whose predictions are priorities."),
    fit_draws: int = OFFLINE("fit_draws", help="Draws whose steps fit the vLLM cost model (the rest are held out)."),
    workload: str = OFFLINE("workload", help=WORKLOAD_HELP),
    bench: str = OFFLINE("bench", help="Benchmark the table was built from (the prompts are re-read from it)."),
    predictors_dir: str = OFFLINE("predictors_dir", help=PREDICTORS_DIR_HELP),
    out: str = OFFLINE("out", help="Output directory (resumes per run)."),
):
    """Real run 2: vllm.LLM with priority scheduling, FCFS vs SJF by each predictor vs oracle; the vLLM cost model
    and the simulator's replay. Needs vllm (`pip install -e '.\\[vllm]'`); run it on an otherwise idle machine."""
    from lenpred.studies.vllm_offline import run_vllm_offline, save_offline_report

    cfg = VLLMOfflineConfig(num_requests=num_requests, draws=draws, seed=seed, max_output_len=max_output_len,
                            max_num_seqs=max_num_seqs, predictors=_names(predictors), fit_draws=fit_draws, out=out,
                            workload=workload, bench=bench, predictors_dir=predictors_dir)
    paths = save_offline_report(run_vllm_offline(cfg), out)
    typer.echo(paths["md"].read_text())
    typer.echo(f"wrote {out}/vllm_offline.json, {out}/cost_vllm.json, {', '.join(str(p) for p in paths.values())}")


@schedule_app.command("vllm-serve")
@one_line_errors
def schedule_vllm_serve(
    num_requests: int = VSERVE("num_requests", help="Requests per workload draw."),
    draws: int = VSERVE("draws", help="Workload draws (bootstrap over draws)."),
    seed: int = VSERVE("seed", help="First workload / arrival seed."),
    max_output_len: int = VSERVE("max_output_len", help="Only requests whose true length is at most this (tokens)."),
    max_num_seqs: int = VSERVE("max_num_seqs", help="vLLM concurrency limit."),
    rate: Optional[float] = VSERVE("rate_per_s", "--rate", help="Poisson arrivals (req/s) \\[default: --load x run "
                                   "2's FCFS rate]."),
    load: float = VSERVE("load", help="Arrival rate as a share of run 2's FCFS throughput (req/s)."),
    port: int = VSERVE("port", help="vllm serve port (loopback)."),
    proxy_port: int = VSERVE("proxy_port", help="lenpred serve port (loopback)."),
    predictor: Optional[str] = VSERVE("predictor", help="Predictor the proxy loads \\[default: the one shipped]."),
    vllm_cpus: Optional[str] = VSERVE("vllm_cpus", help="CPUs vllm serve is pinned to, e.g. 0 \\[default: not "
                                      "pinned]."),
    proxy_cpus: Optional[str] = VSERVE("proxy_cpus", help="CPUs lenpred serve and the load generator are pinned to, "
                                       "e.g. 1 \\[default: not pinned]."),
    ignore_eos: bool = VSERVE("ignore_eos", "--ignore-eos", help="Force each request to its benchmark length "
                              "(max_tokens = true length + ignore_eos): a diagnostic, labelled so \\[default: "
                              "natural EOS]."),
    max_tokens: Optional[int] = VSERVE("max_tokens", help="Cap sent with natural EOS (tokens) \\[default: the "
                                       "request's benchmark cap]."),
    temperature: float = VSERVE("temperature", help="Sampling temperature with natural EOS (above 0: a per-request "
                                "seed, the same in every mode)."),
    data_dir: Optional[str] = VSERVE("data_dir", help=DATA_DIR_HELP),
    workload: str = VSERVE("workload", help=WORKLOAD_HELP),
    bench: str = VSERVE("bench", help="Benchmark the table was built from (its prompt files are sent)."),
    predictors_dir: str = VSERVE("predictors_dir", help=PREDICTORS_DIR_HELP),
    out: str = VSERVE("out", help="Output directory (resumes per run)."),
):
    """Real run 3: starts vllm serve --scheduling-policy priority and lenpred serve in front (both killed on
    exit), replays Poisson arrivals with streaming requests: FCFS vs predicted vs oracle priority."""
    from lenpred.studies.vllm_serve import run_vllm_serve, save_serve_report

    cfg = VLLMServeConfig(num_requests=num_requests, draws=draws, seed=seed, max_output_len=max_output_len,
                          max_num_seqs=max_num_seqs, rate_per_s=rate, load=load, port=port, proxy_port=proxy_port,
                          predictor=predictor, data_dir=data_dir, vllm_cpus=vllm_cpus, proxy_cpus=proxy_cpus, out=out,
                          ignore_eos=ignore_eos, max_tokens=max_tokens, temperature=temperature, workload=workload,
                          bench=bench, predictors_dir=predictors_dir)
    paths = save_serve_report(run_vllm_serve(cfg), out)
    typer.echo(paths["md"].read_text())
    typer.echo(f"wrote {out}/vllm_serve.json, {', '.join(str(p) for p in paths.values())}")


DIAGNOSE = Defaults(DiagnoseConfig)


@app.command()
@one_line_errors
def diagnose(
    model: Optional[str] = DIAGNOSE("model", help=BENCH_MODEL_HELP),
    bench: str = DIAGNOSE("bench", help=BENCH_HELP),
    data_dir: Optional[str] = DIAGNOSE("data_dir", help=DATA_DIR_HELP),
    cache: Optional[str] = DIAGNOSE("cache", help=CACHE_HELP),
    evaluate_dir: str = DIAGNOSE("evaluate", "--evaluate", help="lenpred evaluate output to read."),
    out: str = DIAGNOSE("out", help="Output directory for REPORT.md, PNGs and JSON."),
    sections: str = DIAGNOSE("sections", help="Sections to compute; the others are re-rendered from OUT if present."),
    skip: str = typer.Option("", help="Sections to leave out of --sections (e.g. overhead,ablation for speed)."),
    attribution_prompts: int = DIAGNOSE("attribution_prompts", help="Test prompts per scenario for the gradient "
                                        "attribution."),
    pruned_ks: str = DIAGNOSE("pruned_ks", help="Pruned output-vocabulary sizes scored offline."),
    overhead_k: int = DIAGNOSE("overhead_k", help="Pruned vocabulary size timed in the overhead section."),
    seeds: str = DIAGNOSE("seeds", help="Head seeds (ablation headline, cheaper entropy)."),
    max_batch_tokens: int = DIAGNOSE("max_batch_tokens", help="Overhead: skip batches with more prompt tokens (CPU "
                                     "time)."),
    overhead_repeats: int = DIAGNOSE("overhead_repeats", help="Overhead: timed runs per variant (fastest counts)."),
    overhead_batch_sizes: str = DIAGNOSE("overhead_batch_sizes", help="Overhead: batch sizes."),
    overhead_lengths: str = DIAGNOSE("overhead_lengths", help="Overhead: prompt lengths (tokens)."),
    threads: Optional[int] = DIAGNOSE("threads", help=THREADS_HELP),
):
    """Diagnostics: entropy/semantic misalignment, gradient attribution, ablations, a cheaper entropy and the
    signals' overhead; writes OUT/REPORT.md (+ PNGs, diagnose.json). Time it on an otherwise idle machine."""
    from rich.console import Console

    from lenpred.studies.diagnose.run import render_diagnose, run_diagnose

    skipped = set(_names(skip))
    report = run_diagnose(DiagnoseConfig(
        model=model, bench=bench, data_dir=data_dir, cache=cache, evaluate=evaluate_dir, out=out,
        sections=tuple(s for s in _names(sections) if s not in skipped), attribution_prompts=attribution_prompts,
        pruned_ks=_ints("--pruned-ks", pruned_ks), overhead_k=overhead_k, seeds=_ints("--seeds", seeds),
        max_batch_tokens=max_batch_tokens, overhead_repeats=overhead_repeats, threads=threads,
        overhead_batch_sizes=_ints("--overhead-batch-sizes", overhead_batch_sizes),
        overhead_lengths=_ints("--overhead-lengths", overhead_lengths)))
    render_diagnose(report, Console())


if __name__ == "__main__":  # vLLM spawns an engine process: the guard is required
    app()
