"""A saved predictor's test card (lenpred.predictor_card): scores against hand-worked values."""

import numpy as np
from lenpred.prediction import LengthPrediction
from lenpred.predictor_card import card_from_test_split


def test_card_scores_each_scenario_and_overall_by_hand():
    # expected 10, 20, 30, 40 with intervals [5, 15], [10, 30], [31, 35], [0, 100]; observed 12, 20, 25, 40
    # a: |errors| 2, 0 -> MAE 1.0; 12 and 20 inside -> coverage 1.0; widths 10, 20 -> 15
    # b: |errors| 5, 0 -> MAE 2.5; 25 outside [31, 35], 40 inside -> 0.5; widths 4, 100 -> 52
    # overall: MAE 7 / 4 = 1.75, coverage 3 / 4, width 134 / 4 = 33.5
    bounds = [(10, 5, 15), (20, 10, 30), (30, 31, 35), (40, 0, 100)]
    predictions = [LengthPrediction(8, e, e, lo, hi, 0.8) for e, lo, hi in bounds]
    card = card_from_test_split(predictions, np.array([12.0, 20.0, 25.0, 40.0]), np.array(["a", "a", "b", "b"]),
                                np.array(["p0", "p1", "p2", "p3"]))
    assert list(card) == ["a", "b", "overall"]
    got = {g: (c["n"], c["mae"], c["interval_coverage"], c["mean_interval_width"]) for g, c in card.items()}
    assert got == {"a": (2, 1.0, 1.0, 15.0), "b": (2, 2.5, 0.5, 52.0), "overall": (4, 1.75, 0.75, 33.5)}
    low, high = card["overall"]["mae_ci"]  # a bootstrap over the four prompts: between the least and most error
    assert 0.0 <= low <= 1.75 <= high <= 5.0
