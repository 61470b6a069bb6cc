"""``lenpred predict`` before vs after it took the cheapest forward (issue 37; ``scripts/predict_speed.py``): the
README's 3 prompts and 32 prompts, warm, in one paired, interleaved run.

``before`` is ``src/`` at git revision ``before`` (``git archive``, in a temporary directory; the shipped predictor
then always ran the full prefill: every layer, the LM head over every prompt position for the entropy, the last
layer's attention), ``after`` is this checkout's ``src/`` (the truncated forward to layer 15 for the shipped
``last@15``). Both read the same converted model from the lenpred cache. Two measurements:

* **warm, in-process** (what a long-lived caller pays): one worker process per side (:func:`worker`) loads the
  shipped predictor with ``threads`` torch threads and predicts each prompt set once to warm up; then, ``rounds``
  times, each set is predicted by both workers in turn (before first in even rounds, after first in odd ones), timed
  with ``perf_counter`` around ``LengthPredictor.predict``;
* **whole process** (what one ``lenpred predict`` command costs, model load and torch import included, the model
  cache warm): ``cli_rounds`` pairs of ``lenpred predict --threads T`` commands, alternating in the same way.

Per side and prompt set: the median (min–max) milliseconds and the paired ratio before / after (median and min–max
over the rounds), and a check that both sides predict the same to 0.1 token (float32 rounding of the two forwards;
the CLI rounds to 0.1). The 32 prompts are the first 32 Vicuna-bench questions of the data directory. The machine is
shared: quote medians and ratios.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from lenpred.errors import LenpredError
from lenpred.io import write_json
from lenpred.tables import markdown_table

SRC = Path(__file__).resolve().parents[2]
"""This checkout's ``src/`` (the ``after`` side); its parent is the git work tree."""
README_PROMPTS = ["Write a haiku about rain", "Write a 1000-word story about a lighthouse keeper", "What is 17 * 23?"]
CLI = "import sys; from lenpred.cli import app; sys.argv[0] = 'lenpred'; app()"
"""``lenpred`` as a ``python -c`` program (the side's ``src/`` on ``PYTHONPATH``)."""
MEASUREMENTS = ("warm_in_process", "whole_process")


@dataclass
class PredictSpeedConfig:
    """Settings of the before / after timing."""

    before: str = "main"
    """The git revision whose ``src/`` is the ``before`` side."""
    rounds: int = 7
    """Paired in-process rounds per prompt set."""
    cli_rounds: int = 5
    """Paired ``lenpred predict`` command rounds per prompt set."""
    threads: int = 1
    """Torch threads of every prediction."""
    data_dir: str | None = None
    """Prompt data sets (``None``: ``$LENPRED_DATA_DIR`` or ``../shared/datasets``)."""
    out: str = "results/scripts/predict_speed/predict_speed.json"
    """The report's JSON."""

    def __post_init__(self):
        if min(self.rounds, self.cli_rounds, self.threads) < 1:
            raise LenpredError("rounds, cli_rounds and threads must be >= 1")


@dataclass
class PredictSpeedReport:
    """The report; :meth:`to_dict` is the JSON (``<measurement>_<prompt set>`` keys after the settings)."""

    before_revision: str
    """``before``'s short git revision."""
    after_revision: str
    """``HEAD``'s, with `` + uncommitted changes`` when ``src/`` differs from it."""
    threads: int
    """As configured."""
    rounds: int
    """As configured."""
    cli_rounds: int
    """As configured."""
    cells: dict
    """``{measurement: {prompt set: paired()}}`` (:data:`MEASUREMENTS`, :func:`paired` plus ``max_diff_tokens``)."""

    def to_dict(self) -> dict:
        head = {k: getattr(self, k) for k in ("before_revision", "after_revision", "threads", "rounds", "cli_rounds")}
        return head | {f"{m}_{name}": cell for m, sets in self.cells.items() for name, cell in sets.items()}

    @classmethod
    def from_dict(cls, d: dict) -> PredictSpeedReport:
        """The report of a JSON written by :meth:`to_dict`."""
        cells = {m: {k[len(m) + 1:]: v for k, v in d.items() if k.startswith(m + "_")} for m in MEASUREMENTS}
        return cls(d["before_revision"], d["after_revision"], d["threads"], d["rounds"], d["cli_rounds"], cells)


def worker(threads: int) -> None:
    """A side's worker process (run as source by :class:`Side`, so it imports only the side's own ``lenpred``):
    answer ``{"prompts": [...]}`` lines on stdin with ``{"ms": ..., "expected": [...]}``, after a first line
    ``{"ready": <the imported lenpred file>}``."""
    import json
    import sys
    import time

    from lenpred import pipeline

    lp = pipeline.LengthPredictor.from_pretrained(threads=threads)
    print(json.dumps({"ready": pipeline.__file__}), flush=True)
    for line in sys.stdin:
        prompts = json.loads(line)["prompts"]
        t = time.perf_counter()
        out = lp.predict(prompts)
        ms = 1e3 * (time.perf_counter() - t)
        print(json.dumps({"ms": ms, "expected": [p.expected for p in out]}), flush=True)


class Side:
    """One worker process (:func:`worker`) running ``src`` (``PYTHONPATH``).

    Raises:
        LenpredError: the worker imported ``lenpred`` from elsewhere."""

    def __init__(self, name: str, src: Path, threads: int):
        self.name, self.env = name, {**os.environ, "PYTHONPATH": str(src)}
        code = textwrap.dedent(inspect.getsource(worker)) + f"\nworker({threads})\n"
        self.proc = subprocess.Popen([sys.executable, "-c", code], env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline())["ready"]
        if not ready.startswith(str(src)):
            raise LenpredError(f"{name} imported lenpred from {ready}, not {src}")

    def predict(self, prompts: list) -> tuple[float, list[float]]:
        """``(ms, expected lengths)`` of one warm ``predict`` call."""
        self.proc.stdin.write(json.dumps({"prompts": prompts}) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        return out["ms"], out["expected"]

    def cli(self, prompt_file: Path, threads: int) -> tuple[float, list[float]]:
        """``(ms, expected lengths)`` of one ``lenpred predict --file`` command."""
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CLI, "predict", "--threads", str(threads), "--file",
                              str(prompt_file)], env=self.env, capture_output=True, text=True, check=True)
        return 1e3 * (time.perf_counter() - t), [json.loads(line)["expected"] for line in out.stdout.splitlines()]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def summary(values: list[float]) -> dict:
    """Median (the mean of the middle two for an even count), min, max and count."""
    s = sorted(values)
    return {"median": s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2,
            "min": s[0], "max": s[-1], "n": len(s)}


def paired(before: list[float], after: list[float]) -> dict:
    """Both sides' :func:`summary` (ms) and that of the per-round ratios before / after."""
    return {"before_ms": summary(before), "after_ms": summary(after),
            "ratio_before_over_after": summary([b / a for b, a in zip(before, after)])}


def run_pairs(sides: tuple, rounds: int, measure) -> tuple[list, list]:
    """``measure(side) -> (ms, predictions)`` for both sides in turn, ``rounds`` times, alternating who goes first;
    returns ``([before ms, after ms], [before predictions, after predictions])``, one entry per round."""
    times: dict[str, list[float]] = {s.name: [] for s in sides}
    outputs: dict[str, list] = {s.name: [] for s in sides}
    for r in range(rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            ms, out = measure(side)
            times[side.name].append(ms)
            outputs[side.name].append(out)
    return [times[s.name] for s in sides], [outputs[s.name] for s in sides]


def check_same(before: list, after: list, what: str) -> float:
    """The largest difference of the predicted lengths between the sides, over rounds and prompts.

    Raises:
        LenpredError: above 0.1 token."""
    worst = max(abs(b - a) for bs, as_ in zip(before, after) for b, a in zip(bs, as_))
    if worst > 0.1:
        raise LenpredError(f"{what}: before and after predict differently (up to {worst:.3f} tokens)")
    return worst


def _git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=SRC.parent, check=True, capture_output=True).stdout


def _prompt_sets(data_dir: str | None) -> dict[str, list[str]]:
    from lenpred.bench.sources import default_data_dir

    lines = (Path(data_dir or default_data_dir()) / "vicuna_bench" / "question.jsonl").read_text().splitlines()
    return {"readme_3": README_PROMPTS, "vicuna_32": [json.loads(line)["turns"][0] for line in lines[:32]]}


def _measure(sides: tuple, sets: dict, cfg: PredictSpeedConfig, tmp: Path) -> dict:
    """:attr:`PredictSpeedReport.cells`: warm in-process calls, then (the workers closed) whole commands."""
    cells: dict[str, dict] = {m: {} for m in MEASUREMENTS}
    for prompts in sets.values():  # warm-up: torch's first calls, the prefix of the chat template
        for side in sides:
            side.predict(prompts)
    for name, prompts in sets.items():
        (b, a), (bo, ao) = run_pairs(sides, cfg.rounds, lambda side, p=prompts: side.predict(p))
        cells["warm_in_process"][name] = paired(b, a) | {"max_diff_tokens": check_same(bo, ao, name)}
    for side in sides:
        side.close()
    for name, prompts in sets.items():
        prompt_file = tmp / f"{name}.txt"
        prompt_file.write_text("".join(p + "\n" for p in prompts))
        (b, a), (bo, ao) = run_pairs(sides, cfg.cli_rounds, lambda side, f=prompt_file: side.cli(f, cfg.threads))
        cells["whole_process"][name] = paired(b, a) | {"max_diff_tokens": check_same(bo, ao, name)}
    return cells


def run(cfg: PredictSpeedConfig) -> PredictSpeedReport:
    """Both sides on both prompt sets; the report is written to ``cfg.out``.

    Raises:
        LenpredError: a side imported the wrong ``lenpred``, or the sides predict differently."""
    sets = _prompt_sets(cfg.data_dir)
    dirty = " + uncommitted changes" if _git("status", "--porcelain", "src").strip() else ""
    head = (_git("rev-parse", "--short", cfg.before).decode().strip(),
            _git("rev-parse", "--short", "HEAD").decode().strip() + dirty)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "before.tar"
        archive.write_bytes(_git("archive", "--format=tar", cfg.before, "src"))
        with tarfile.open(archive) as tar:
            tar.extractall(Path(tmp) / "before", filter="data")
        sides = (Side("before", Path(tmp) / "before" / "src", cfg.threads), Side("after", SRC, cfg.threads))
        cells = _measure(sides, sets, cfg, Path(tmp))
    report = PredictSpeedReport(*head, cfg.threads, cfg.rounds, cfg.cli_rounds, cells)
    write_json(cfg.out, report.to_dict())
    return report


def render_markdown(report: PredictSpeedReport) -> str:
    """One row per measurement and prompt set: both sides' median (min–max) ms, the paired ratio, the largest
    difference of the predictions."""
    ms = lambda s: f"{s['median']:.0f} ({s['min']:.0f}–{s['max']:.0f})"  # noqa: E731
    rows = [[m.replace("_", " "), name, c["before_ms"]["n"], ms(c["before_ms"]), ms(c["after_ms"]),
             f"{c['ratio_before_over_after']['median']:.2f} ({c['ratio_before_over_after']['min']:.2f}–"
             f"{c['ratio_before_over_after']['max']:.2f})", f"{c['max_diff_tokens']:.2f}"]
            for m, sets in report.cells.items() for name, c in sets.items()]
    return (f"`lenpred predict`, {report.before_revision} (before) vs {report.after_revision} (after), "
            f"{report.threads} torch thread(s)\n\n"
            + markdown_table(["measurement", "prompts", "rounds", "before ms median (min–max)",
                              "after ms median (min–max)", "before / after", "max Δ tokens"], rows, "llrrrrr")
            + "\n")
