"""Length predictors, registered by name.

Every predictor follows the scikit-learn contract on a list of :class:`Request` (one per sample;
samples of the same prompt repeat the same object) and true lengths ``y`` in tokens:
``fit(requests, y) -> self``, ``predict(requests) -> (n,) float64 tokens``, ``save(path)`` and
``load(path)`` round-trip exactly. A predictor declares what it reads once, in :meth:`Predictor.reads` (a
:class:`Reads`: the inputs a loader provides — ``signals``, ``text``, ``self_report``, ``scenario`` — and which
prefill signals: layer, entropy, attention, the cheapest forward that feeds it), and the candidates it is tuned over
in :meth:`Predictor.param_grid`. A feature head (``reads().features``) also implements :meth:`Predictor.features`
and :meth:`Predictor.distribution_from_features` and sets :attr:`Predictor.n_features_in_`. Adding one is one
registered class; every registered one passes the contract suite (``tests/predictors/test_contract.py``).
"""

from lenpred.predictors.registry import (PREDICTORS, Predictor, Reads, Request,  # noqa: F401
                                         distinct_requests, make_predictor, max_new_tokens, num_prompt_tokens,
                                         register, required_inputs, unique_map)

from lenpred.predictors import ltr, pia, pooled, proxy, trail, trivial  # noqa: F401  (registration side effect)

__all__ = ["PREDICTORS", "Predictor", "Reads", "Request", "distinct_requests", "make_predictor",
           "max_new_tokens", "num_prompt_tokens", "register", "required_inputs", "unique_map"]
