"""``lenpred <command>``: each command builds a config and calls one library function.

A :class:`lenpred.LenpredError` (bad input the user can fix) is printed as one line and exits 2.
"""

from __future__ import annotations

import functools
from typing import Optional

import typer

from lenpred.errors import LenpredError
from lenpred.evaluate import ALL_METHODS, DEMO_METHODS

app = typer.Typer(help="Predict LLM output length from the serving model's own prefill signals.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
bench_app = typer.Typer(help="Build ForeLen-style benchmarks sampled from a model.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def one_line_errors(fn):
    """Turn :class:`LenpredError` into ``error: <message>`` on stderr and exit status 2."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LenpredError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    return wrapper


def _ints(option: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise LenpredError(f"{option} takes comma-separated integers (e.g. 0,1,2), got '{text}'") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


MODEL = typer.Option("smollm2-135m-instruct", help="Backbone: default alias, hub id or local directory.")
DATA_DIR = typer.Option(None, help="Prompt data sets \\[default: $LENPRED_DATA_DIR or ../shared/datasets].")
CACHE = typer.Option(None, help="Signal cache directory \\[default: under $LENPRED_CACHE].")
LAYERS = typer.Option("15,22,-1", help="Hidden-state layers to extract in full and search (-1 = last).")
EPOCHS = typer.Option(150, help="Head training epochs.")
SKIP = typer.Option(True, help="Pool only over tokens after the prefix all prompts share.")
THREADS = typer.Option(None, help="torch threads for the backbone and text encoders.")


def _evaluate(title: str, **kwargs) -> None:
    from lenpred.evaluate import EvalConfig, run_evaluate

    run_evaluate(EvalConfig(**kwargs), title=title)


@app.command()
@one_line_errors
def demo(
    model: str = MODEL,
    bench: str = typer.Option("benchmarks/smollm2-forelen", help="Benchmark directory (lenpred bench build)."),
    data_dir: Optional[str] = DATA_DIR,
    out: str = typer.Option("results/demo", help="Output directory for results.json / .md / .png."),
    cache: Optional[str] = CACHE,
    layers: str = LAYERS,
    methods: str = typer.Option(",".join(DEMO_METHODS), help="Predictors to run."),
    epochs: int = EPOCHS,
    seed: int = typer.Option(0, help="Head seed."),
    skip_shared_prefix: bool = SKIP,
    threads: Optional[int] = THREADS,
):
    """Train EGTP, ESTP and baselines on a stored benchmark and print the test MAE/RMSE table."""
    _evaluate("demo", model=model, bench=bench, data_dir=data_dir, out=out, cache=cache,
              layers=_ints("--layers", layers), methods=_names(methods), epochs=epochs, seeds=(seed,),
              skip_shared_prefix=skip_shared_prefix, threads=threads)


@app.command()
@one_line_errors
def evaluate(
    model: str = MODEL,
    bench: str = typer.Option("benchmarks/smollm2-forelen", help="Benchmark directory (lenpred bench build)."),
    data_dir: Optional[str] = DATA_DIR,
    out: str = typer.Option("results/evaluate", help="Output directory for results.json / .md / .png."),
    cache: Optional[str] = CACHE,
    layers: str = LAYERS,
    methods: str = typer.Option(",".join(ALL_METHODS), help="Predictors to run, in table order."),
    seeds: str = typer.Option("0,1,2", help="Seeds of the learned predictors (tuned with the first)."),
    epochs: int = EPOCHS,
    proxy_encoder: str = typer.Option("minilm", help="SSJF / S3 text encoder: minilm (packaged) or a local directory."),
    proxy_epochs: int = typer.Option(2, help="Fine-tuning epochs of the SSJF / S3 text encoders."),
    trail_layers: Optional[str] = typer.Option(None, help="TRAIL layer sweep \\[default: every layer]."),
    skip_shared_prefix: bool = SKIP,
    threads: Optional[int] = THREADS,
):
    """Every predictor (baselines, poolers, EGTP, ESTP) on the same splits: the comparison table."""
    _evaluate("evaluate", model=model, bench=bench, data_dir=data_dir, out=out, cache=cache,
              layers=_ints("--layers", layers), methods=_names(methods), seeds=_ints("--seeds", seeds),
              epochs=epochs, proxy_encoder=proxy_encoder, proxy_epochs=proxy_epochs,
              trail_layers=None if trail_layers is None else _ints("--trail-layers", trail_layers),
              skip_shared_prefix=skip_shared_prefix, threads=threads)


@bench_app.command("build")
@one_line_errors
def bench_build(
    out: str = typer.Option(..., help="Benchmark directory (created, or resumed if it exists)."),
    preset: str = typer.Option("first", help="Benchmark preset: first, forelen or tiny."),
    model: str = typer.Option("smollm2-135m-instruct", help="Model to sample from."),
    engine: str = typer.Option("auto", help="auto (vLLM if installed), vllm or transformers."),
    data_dir: Optional[str] = typer.Option(None, help="Prompt data sets directory."),
    max_shards: Optional[int] = typer.Option(None, help="Stop after this many new shards."),
    seed: int = typer.Option(0, help="Seed of prompt order, splits and per-request seeds."),
):
    """Sample a benchmark (resumable: rerun the same command to continue where it stopped)."""
    from lenpred.bench.build import build_benchmark
    from lenpred.bench.plan import preset as make_preset

    config = make_preset(preset, model)
    config.seed = seed
    path = build_benchmark(config, out, engine=engine, data_dir=data_dir, max_shards=max_shards)
    typer.echo(f"benchmark in {path}")


@bench_app.command("card")
@one_line_errors
def bench_card(bench: str = typer.Argument(..., help="Benchmark directory.")):
    """Write the dataset card (CARD.md, card.json, card.png) next to the benchmark's shards."""
    from lenpred.bench.card import write_card

    paths = write_card(bench)
    typer.echo(paths["md"].read_text())
    typer.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


if __name__ == "__main__":  # vLLM spawns an engine process: the guard is required
    app()
