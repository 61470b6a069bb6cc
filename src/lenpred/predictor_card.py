"""A saved predictor's test card: scored on the benchmark's test split (:func:`card_from_test_split`) and rendered
for people (:func:`render_card`, the directory's ``CARD.md``). A traffic refit's card:
:func:`lenpred.traffic_refit.traffic_card`."""

from __future__ import annotations

import json

import numpy as np

from lenpred.intervals import interval_coverage
from lenpred.tables import markdown_table


def card_from_test_split(predictions: list, y: np.ndarray, scenario: np.ndarray, prompt_id: np.ndarray) -> dict:
    """MAE per scenario and overall, with 95 % intervals from a bootstrap clustered by prompt, interval coverage
    and mean interval width.

    Args:
        predictions: one :class:`lenpred.prediction.LengthPrediction` per test sample.
        y: ``(n,)`` observed output tokens; scenario, prompt_id: ``(n,)`` str, each sample's scenario and prompt.

    Returns:
        ``{group: {"n", "mae", "mae_ci", "interval_coverage", "mean_interval_width"}}`` (tokens), groups sorted,
        ``"overall"`` last.
    """
    from lenpred.metrics import clustered_bootstrap

    expected, lows, highs = (np.array([getattr(p, k) for p in predictions]) for k in ("expected", "low", "high"))
    card = {}
    for g in [*sorted(set(scenario.tolist())), "overall"]:
        m = (scenario == g) if g != "overall" else np.ones(len(y), bool)
        mae, lo, hi = clustered_bootstrap(np.abs(expected[m] - y[m]), prompt_id[m])
        low, high = lows[m], highs[m]
        card[g] = {"n": int(m.sum()), "mae": mae, "mae_ci": [lo, hi],
                   "interval_coverage": interval_coverage(low, high, y[m]),
                   "mean_interval_width": float(np.mean(high - low))}
    return card


def render_card(config, card: dict) -> str:
    """The Markdown card of a saved predictor: what it is, how it was trained, its test scores. ``config``: its
    :class:`lenpred.predictor_config.PredictorConfig`."""
    lines = [f"# lenpred predictor: {config.method} on {config.model_id}", "",
             f"* model revision `{config.model_revision}`, layers {config.layers}, prompt rule "
             f"`{config.template_rule}`, lenpred {config.lenpred_version}", *data_lines(config), ""]
    rows = [[g, c["n"], f"{c['mae']:.1f}",
             "–" if c["mae_ci"][0] is None else f"[{c['mae_ci'][0]:.1f}, {c['mae_ci'][1]:.1f}]",
             f"{c['interval_coverage']:.3f}", f"{c['mean_interval_width']:.0f}"] for g, c in card.items()]
    lines.append(markdown_table(["test group", "samples", "MAE (tokens)", "95 % CI", "interval coverage",
                                 "mean interval width"], rows, "lrrrrr"))
    for g, c in card.items():
        for name, who in (("base", "the predictor it was refitted from"), ("incumbent", "the predictor in service")):
            if f"{name}_mae" in c:
                d = c[f"mae_minus_{name}"]
                ci = "" if d[1] is None else f" [{d[1]:+.1f}, {d[2]:+.1f}]"
                lines.append(f"\nOn the {g} ({c['n']} requests) {who} has MAE {c[f'{name}_mae']:.1f}: difference "
                             f"{d[0]:+.1f}{ci} tokens (paired, prompt-clustered 95 % interval).")
    return "\n".join(lines) + "\n"


def data_lines(config) -> list[str]:
    """The card's lines on where a predictor's training data came from: a benchmark, logged traffic, or both."""
    bench, traffic = config.training_benchmark, config.training_traffic
    chosen = config.chosen_on_validation
    lines = []
    if bench is not None:
        what = f"`{bench.name}` (plan `{bench.plan_fingerprint}`, {bench.num_records} records"
        if traffic is None:
            lines.append(f"* trained on {what}; duplicates across splits dropped: {bench.dropped_duplicates}), "
                         f"hyper-parameters chosen on its validation split: `{json.dumps(dict(chosen))}`")
        else:
            lines.append(f"* mixed into training: benchmark {what} of its {bench.split or 'train'} split)")
    if traffic is not None:
        lines.append(_traffic_line(traffic, chosen))
    where = "the logged calibration requests" if traffic is not None else "validation"
    lines.append(f"* interval: nominal {config.coverage:.0%} coverage, split-conformal margin "
                 f"{config.interval_margin:.1f} tokens (calibrated on {where})")
    return lines


def _traffic_line(traffic, chosen: dict) -> str:
    """The card's line on a traffic refit's log, its time split and how the head was trained."""
    if "first_head_of" in chosen:
        how = "the model's first head (captured with no head; the shipped head's hyper-parameters)"
    elif "finetuned" in chosen:
        how = (f"fine-tuned from {chosen.get('refit_of')} ({json.dumps(chosen['finetuned'])}, chosen on the "
               "training part's latest 20 %)")
    else:
        how = f"hyper-parameters of {chosen.get('refit_of')}"
    return (f"* trained on logged traffic `{traffic.log}`: {traffic.num_records} finished requests "
            f"({traffic.parts} part{'' if traffic.parts == 1 else 's'}, {traffic.features_dtype} features), "
            f"split in time: the earliest {traffic.num_train} train, the next {traffic.num_calibration} "
            f"calibrate the interval, the latest {traffic.num_test} are scored below; " + how)
