"""``lenpred <command>``: each command builds a config and calls one library function.

A :class:`lenpred.LenpredError` (bad input the user can fix) is printed as one line and exits 2.
"""

from __future__ import annotations

import functools
from typing import Optional

import typer

from lenpred.errors import LenpredError

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


def _layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise LenpredError(f"--layers takes comma-separated integers like 15,22,-1, got '{text}'") from None


@app.command()
@one_line_errors
def demo(
    model: str = typer.Option("smollm2-135m-instruct", help="Backbone: default alias, hub id or local directory."),
    bench: str = typer.Option("benchmarks/smollm2-first", help="Benchmark directory (lenpred bench build)."),
    data_dir: Optional[str] = typer.Option(None, help="Prompt data sets [default: $LENPRED_DATA_DIR or "
                                                      "../shared/datasets]."),
    out: str = typer.Option("results/demo", help="Output directory for results.json / results.png."),
    cache: Optional[str] = typer.Option(None, help="Signal cache directory [default: under $LENPRED_CACHE]."),
    layers: str = typer.Option("15,22,-1", help="Hidden-state layers to extract and search (-1 = last)."),
    methods: str = typer.Option("global_median,prompt_length,mean,last,egtp,estp", help="Predictors to run."),
    epochs: int = typer.Option(150, help="Head training epochs."),
    seed: int = typer.Option(0, help="Head seed."),
    skip_shared_prefix: bool = typer.Option(True, help="Pool only over tokens after the prefix all prompts share."),
    threads: Optional[int] = typer.Option(None, help="torch threads."),
):
    """Train EGTP, ESTP and baselines on a stored benchmark and print the test MAE/RMSE table."""
    from lenpred.demo import DemoConfig, run_demo

    run_demo(DemoConfig(model=model, bench=bench, data_dir=data_dir, out=out, cache=cache, layers=_layers(layers),
                        methods=tuple(m.strip() for m in methods.split(",")), epochs=epochs, seed=seed,
                        skip_shared_prefix=skip_shared_prefix, threads=threads))


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
