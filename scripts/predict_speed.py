"""`lenpred predict` before vs after it took the cheapest forward (issue 37): the README's 3 prompts and 32 prompts,
warm, in one paired, interleaved run.

Usage: python scripts/predict_speed.py [--before main] [--rounds 7] [--cli-rounds 5] [--threads 1]
       [--data-dir ../shared/datasets] [--out results/scripts/predict_speed/predict_speed.json]

``before`` is ``src/`` at git revision ``--before`` (``git archive``, in a temporary directory; the shipped predictor
then always ran the full prefill: every layer, the LM head over every prompt position for the entropy, the last
layer's attention), ``after`` is this checkout's ``src/`` (the truncated forward to layer 15 for the shipped
``last@15``). Both read the same converted model from the lenpred cache. Two measurements:

* **warm, in-process** (what a long-lived caller pays): one worker process per side loads the shipped predictor
  with ``--threads`` torch threads and predicts each prompt set once to warm up; then, ``--rounds`` times, each set
  is predicted by both workers in turn (before first in even rounds, after first in odd ones), timed with
  ``perf_counter`` around ``LengthPredictor.predict``;
* **whole process** (what one ``lenpred predict`` command costs, model load and torch import included, the model
  cache warm): ``--cli-rounds`` pairs of ``lenpred predict --threads T`` commands, alternating in the same way.

Per side and prompt set it reports the median (min–max) milliseconds and the paired ratio before / after (median and
min–max over the rounds), and checks that both sides print the same predictions to 0.1 token (float32 rounding of
the two forwards; the CLI rounds to 0.1). The 32 prompts are the first 32 Vicuna-bench questions of the data
directory. The machine is shared: quote medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_PROMPTS = ["Write a haiku about rain", "Write a 1000-word story about a lighthouse keeper", "What is 17 * 23?"]
CLI = "import sys; from lenpred.cli import app; sys.argv[0] = 'lenpred'; app()"


def worker(threads: int) -> None:
    """Answer ``{"prompts": [...]}`` lines on stdin with ``{"ms": ..., "expected": [...], "lenpred": path}``."""
    import lenpred
    from lenpred.pipeline import LengthPredictor

    lp = LengthPredictor.from_pretrained(threads=threads)
    print(json.dumps({"ready": lenpred.__file__}), flush=True)
    for line in sys.stdin:
        prompts = json.loads(line)["prompts"]
        t = time.perf_counter()
        out = lp.predict(prompts)
        ms = 1e3 * (time.perf_counter() - t)
        print(json.dumps({"ms": ms, "expected": [p.expected for p in out]}), flush=True)


class Side:
    """One worker process running ``src`` (``PYTHONPATH``)."""

    def __init__(self, name: str, src: Path, threads: int):
        self.name, self.env = name, {**os.environ, "PYTHONPATH": str(src)}
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", "--threads", str(threads)], env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline())["ready"]
        if not ready.startswith(str(src)):
            raise SystemExit(f"{name} imported lenpred from {ready}, not {src}")

    def predict(self, prompts: list) -> dict:
        self.proc.stdin.write(json.dumps({"prompts": prompts}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def cli(self, prompt_file: Path, threads: int) -> tuple[float, list[dict]]:
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CLI, "predict", "--threads", str(threads), "--file",
                              str(prompt_file)], env=self.env, capture_output=True, text=True, check=True)
        return 1e3 * (time.perf_counter() - t), [json.loads(line) for line in out.stdout.splitlines()]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def summary(values: list[float]) -> dict:
    s = sorted(values)
    return {"median": s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2,
            "min": s[0], "max": s[-1], "n": len(s)}


def paired(before: list[float], after: list[float]) -> dict:
    return {"before_ms": summary(before), "after_ms": summary(after),
            "ratio_before_over_after": summary([b / a for b, a in zip(before, after)])}


def run_pairs(sides: tuple[Side, Side], rounds: int, measure) -> tuple[list, list]:
    """``measure(side) -> (ms, predictions)`` for both sides in turn, ``rounds`` times, alternating who goes first."""
    times: dict[str, list[float]] = {s.name: [] for s in sides}
    outputs: dict[str, list] = {s.name: [] for s in sides}
    for r in range(rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            ms, out = measure(side)
            times[side.name].append(ms)
            outputs[side.name].append(out)
    return [times[s.name] for s in sides], [outputs[s.name] for s in sides]


def check_same(before: list, after: list, what: str) -> float:
    """The largest difference of ``expected`` between the sides; exits when above 0.1 token."""
    worst = max(abs(b - a) for bs, as_ in zip(before, after) for b, a in zip(bs, as_))
    if worst > 0.1:
        raise SystemExit(f"{what}: before and after predict differently (up to {worst:.3f} tokens)")
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="main")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cli-rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", default=os.environ.get("LENPRED_DATA_DIR", "../shared/datasets"))
    ap.add_argument("--out", default="results/scripts/predict_speed/predict_speed.json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.threads)

    lines = (Path(args.data_dir) / "vicuna_bench" / "question.jsonl").read_text().splitlines()
    sets = {"readme_3": README_PROMPTS, "vicuna_32": [json.loads(line)["turns"][0] for line in lines[:32]]}
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, check=True, capture_output=True).stdout  # noqa: E731
    report = {"before_revision": git("rev-parse", "--short", args.before).decode().strip(),
              "after_revision": git("rev-parse", "--short", "HEAD").decode().strip()
              + (" + uncommitted changes" if git("status", "--porcelain", "src").strip() else ""),
              "threads": args.threads, "rounds": args.rounds, "cli_rounds": args.cli_rounds}
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "before.tar"
        archive.write_bytes(git("archive", "--format=tar", args.before, "src"))
        with tarfile.open(archive) as tar:
            tar.extractall(Path(tmp) / "before", filter="data")
        sides = (Side("before", Path(tmp) / "before" / "src", args.threads), Side("after", ROOT / "src", args.threads))
        for prompts in sets.values():  # warm-up: torch's first calls, the prefix of the chat template
            for side in sides:
                side.predict(prompts)
        for name, prompts in sets.items():
            def in_process(side, prompts=prompts):
                out = side.predict(prompts)
                return out["ms"], out["expected"]
            (b, a), (bo, ao) = run_pairs(sides, args.rounds, in_process)
            report[f"warm_in_process_{name}"] = paired(b, a) | {"max_diff_tokens": check_same(bo, ao, name)}
        for side in sides:
            side.close()
        for name, prompts in sets.items():
            prompt_file = Path(tmp) / f"{name}.txt"
            prompt_file.write_text("".join(p + "\n" for p in prompts))

            def whole(side, prompt_file=prompt_file):
                ms, lines = side.cli(prompt_file, args.threads)
                return ms, [line["expected"] for line in lines]
            (b, a), (bo, ao) = run_pairs(sides, args.cli_rounds, whole)
            report[f"whole_process_{name}"] = paired(b, a) | {"max_diff_tokens": check_same(bo, ao, name)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
