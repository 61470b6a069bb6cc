"""The predictor contract and registry: :class:`Request`, :class:`Reads`, :class:`Predictor` (save / load),
:func:`register`, :func:`make_predictor`, :func:`required_inputs` and helpers over lists of requests
(:mod:`lenpred.predictors` describes the contract)."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from lenpred.errors import LenpredError
from lenpred.io import atomic_path
from lenpred.registry import registrar

PREDICTORS: dict[str, Callable[..., "Predictor"]] = {}


@dataclass(frozen=True)
class Reads:
    """What a predictor reads of a request (:meth:`Predictor.reads`), the one declaration of it: what a loader
    provides (:attr:`inputs`), which forward a pipeline runs, what a serving engine and a traffic log feed it.

    Attributes:
        layer: the hidden-state index it reads (0 = embeddings, ``L`` = the final norm's output, negative from the
            end), ``None`` when it reads no hidden states (text proxies, floors, self-reports).
        token_entropy: it reads every prompt position's next-token entropy (nats; the LM head over the prompt).
        semantic_score: it reads the last layer's attention (ESTP's semantic score; eager attention there).
        last_token: its whole input is the **last prompt token's** state at ``layer``, which a serving engine
            captures in its own prefill (``LengthPredictor.predict_states``).
        features: its head maps a feature vector (:meth:`Predictor.features` ``(n, d)`` float32, ``d =
            n_features_in_``) to a length distribution (:meth:`Predictor.distribution_from_features`): what an
            engine, a traffic log and a refit feed it.
        text: it reads the user-visible prompt text (``Request.text``: the text proxies).
        self_report: it reads the serving model's own answer-length estimate (``Request.self_report``: PiA).
        scenario: it reads the request's workload name (``Request.scenario``: the per-scenario floors).
    """

    layer: int | None = None
    token_entropy: bool = False
    semantic_score: bool = False
    last_token: bool = False
    features: bool = False
    text: bool = False
    self_report: bool = False
    scenario: bool = False

    @property
    def hidden_states_only(self) -> bool:
        """It reads one layer's hidden states and nothing else: a forward that stops at ``layer`` suffices."""
        return self.layer is not None and not (self.token_entropy or self.semantic_score)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The :class:`Request` fields beyond ``token_ids`` it reads, as input-provider names
        (:mod:`lenpred.inputs`): ``signals`` (any prefill signal), ``text``, ``self_report``, ``scenario``."""
        signals = self.layer is not None or self.token_entropy or self.semantic_score
        flags = {"signals": signals, "text": self.text, "self_report": self.self_report, "scenario": self.scenario}
        return tuple(name for name, read in flags.items() if read)


@dataclass(eq=False)
class Request:
    """What a length predictor may look at for one request, before any output token exists.

    Attributes:
        prompt_id: stable id (``<source>/<index>`` for benchmark prompts).
        token_ids: the chat-formatted prompt as the serving model's token ids (``num_prompt_tokens`` long).
        text: the user-visible prompt text (the messages' contents joined by blank lines), for text-only
            proxies (SSJF, S3).
        signals: the serving model's prefill signals (:class:`lenpred.signals.PromptSignals`), or ``None``
            when no predictor in use needs them.
        self_report: the serving model's own answer to "how long will your answer be?" (PiA), or ``None``.
        content_span: token positions ``[start, end)`` of the users' content (:mod:`lenpred.prompts`); ``None``
            means the whole prompt.
        max_new_tokens: the request's generation cap in tokens (known when it arrives): no response is longer,
            so predictions are clipped to it; ``None``: no cap.
        scenario: the workload the request comes from (``longseq``, ``reasoning``, ``rl``, or a user's name), for
            predictors that condition on it (the per-scenario floors); ``None``: unknown.
    """

    prompt_id: str
    token_ids: list[int]
    text: str = ""
    signals: Any = None
    self_report: str | None = None
    content_span: tuple[int, int] | None = None
    max_new_tokens: int | None = None
    scenario: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.token_ids)



def prompt_requests(tokenizer, context_window: int, prompts, max_new_tokens: int | None = None,
                    scenario: str | None = None) -> list[Request]:
    """Prompts (plain strings: one user turn, or OpenAI-style message lists) -> :class:`Request` objects through
    the one prompt path (:func:`lenpred.prompts.prepare_prompt`): token ids, text, content span, cap, scenario;
    ``prompt_id`` is the prompt's position.

    Raises:
        LenpredError: a bad prompt (the message names it, counting from 0), or one that does not fit
            ``context_window`` with ``max_new_tokens``.
    """
    from lenpred.prompts import check_fits, prepare_prompt, prompt_text

    requests = []
    for i, p in enumerate(prompts):
        try:
            prepared = prepare_prompt(tokenizer, p)
        except LenpredError as exc:
            raise LenpredError(f"prompt {i} (counting from 0): {exc}") from None
        check_fits(prepared.num_prompt_tokens, max_new_tokens or 0, context_window, what=f"prompt {i}")
        messages = [{"role": "user", "content": p}] if isinstance(p, str) else p
        requests.append(Request(str(i), list(prepared.token_ids), prompt_text(messages),
                                content_span=(prepared.content_start, prepared.content_end),
                                max_new_tokens=max_new_tokens, scenario=scenario))
    return requests

register = registrar(PREDICTORS, "predictor", name_attr="registry_name")
"""Class decorator adding a predictor to :data:`PREDICTORS` under ``name`` (its ``registry_name``); a name registered
twice is a :class:`LenpredError`."""


def make_predictor(name: str, **params: Any) -> "Predictor":
    """Build a registered predictor.

    Raises:
        LenpredError: unknown name (the message lists the valid ones).
    """
    if name not in PREDICTORS:
        raise LenpredError(f"unknown predictor '{name}'; valid predictors: {', '.join(sorted(PREDICTORS))}")
    return PREDICTORS[name](**params)


def required_inputs(methods) -> set[str]:
    """The inputs a loader provides for the registered predictors ``methods``: the union of their
    :attr:`Reads.inputs`, asked of each one default-constructed (:meth:`Predictor.reads` answers from the
    constructor's parameters, and which inputs a predictor reads does not depend on them).

    Raises:
        LenpredError: an unknown name (the message lists the valid ones).
    """
    return {name for m in methods for name in make_predictor(m).reads().inputs}


class Predictor(ABC):
    """The contract every registered predictor keeps (scikit-learn style; :mod:`lenpred.predictors`).

    Every predictor implements :meth:`fit`, :meth:`predict` and ``_get_state`` / ``_set_state`` (what :meth:`save` /
    :meth:`load` store), and declares once what it reads in :meth:`reads`. One whose ``reads().features`` is true (a
    feature head: the pooled heads, TRAIL) also implements :meth:`features` and :meth:`distribution_from_features`
    and sets :attr:`n_features_in_`: :func:`lenpred.prediction.head_pass` calls those and nothing else.

    ``params`` (constructor arguments) are JSON-able; the fitted state is a dict of numpy arrays / tensors, stored
    with safetensors (no pickle) next to a JSON header.

    Attributes:
        n_features_in_: the width ``d`` of the feature vector the fitted head reads (:meth:`features`' columns: the
            serving model's hidden size for the pooled heads), what an engine's captured states must have;
            ``None`` for a predictor that reads no feature vector (floors, text proxies, self-reports). Set by
            ``fit`` and on load (scikit-learn's ``n_features_in_``).
    """

    registry_name = "base"
    supports_censoring = False  # fit(requests, y, censored=...) treats capped samples as lower bounds
    tune_after: tuple[str, ...] = ()  # predictors whose chosen hyper-parameters param_grid reads (fitted first)
    n_features_in_: int | None = None

    def __init__(self, **params: Any):
        self.params = params

    @classmethod
    def param_grid(cls, ctx: Any) -> list[dict[str, Any]]:
        """Constructor arguments to try on validation (the seed is added by the tuner): a list of dicts, **simplest
        first** (the tuner keeps the first within one standard error of the best: :func:`lenpred.tuning.one_se_choice`).

        ``ctx`` is a :class:`lenpred.tuning.TuningContext` (layers, grids, settings, and the ``chosen``
        hyper-parameters of the predictors in ``tune_after``). Default: the constructor's defaults only.
        """
        return [{}]

    def reads(self) -> Reads:
        """What this predictor reads (:class:`Reads`), from its constructor's parameters alone (never its fitted
        state: a loader asks a default-constructed one, :func:`required_inputs`); default: the token ids only."""
        return Reads()

    def diagnostics(self, requests: list[Request]) -> dict[str, Any]:
        """JSON-able facts about how the fitted predictor treats ``requests`` (e.g. pooling weights); default none."""
        return {}

    @abstractmethod
    def fit(self, requests: list[Request], y: np.ndarray) -> "Predictor":
        """Learn from ``requests`` (their inputs attached) and observed lengths ``y`` ``(n,)`` tokens; returns
        ``self``."""

    @abstractmethod
    def predict(self, requests: list[Request]) -> np.ndarray:
        """``(n,)`` float64 predicted output lengths in tokens."""

    def features(self, requests: list[Request]) -> np.ndarray:
        """A feature head's input ``(n, n_features_in_)`` float32 for ``requests`` (``reads().features``).

        Raises:
            NotImplementedError: this predictor reads no feature vector.
        """
        raise NotImplementedError(f"predictor '{self.registry_name}' ({type(self).__name__}) reads no feature vector "
                                  "(reads().features is false): it predicts from requests only")

    def distribution_from_features(self, features: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(probs, values)``, both ``(n, K)`` float64: each row's bin probabilities (summing to 1) and the length
        each bin stands for, ``min(c_j, cap)`` tokens, from ``features`` ``(n, n_features_in_)`` float32 and caps
        ``(n,)`` tokens (``inf``: none); ``reads().features`` predictors only.

        Raises:
            NotImplementedError: this predictor's head gives no length distribution from features.
        """
        raise NotImplementedError(f"predictor '{self.registry_name}' ({type(self).__name__}) gives no length "
                                  "distribution from features (reads().features is false)")

    @abstractmethod
    def _get_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The fitted state as ``(tensors, JSON-able info)``."""

    @abstractmethod
    def _set_state(self, tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> None:
        """Restore the fitted state :meth:`_get_state` gave."""

    def save(self, path: str | Path) -> None:
        """Write the fitted predictor to ``path`` (a safetensors file with a JSON header), atomically."""
        tensors, info = self._get_state()
        header = {"predictor": self.registry_name, "params": json.dumps(self.params), "info": json.dumps(info)}
        with atomic_path(path) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=header)

    @staticmethod
    def load(path: str | Path) -> "Predictor":
        """Read a predictor written by :meth:`save`.

        Raises:
            LenpredError: the file is missing, unreadable, or not a lenpred predictor; a directory (a saved
                :class:`lenpred.pipeline.LengthPredictor`: the message names its loader).
        """
        from safetensors import SafetensorError, safe_open

        if Path(path).is_dir():
            raise LenpredError(f"{path} is a directory: a predictor saved by `lenpred train` (or the shipped one) loads "
                               "with lenpred.LengthPredictor.from_pretrained(path); Predictor.load reads one head's "
                               ".safetensors file")
        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
            tensors = load_file(str(path))
            name, params, info = header["predictor"], json.loads(header["params"]), json.loads(header["info"])
        except (OSError, KeyError, ValueError, RuntimeError, SafetensorError) as exc:
            raise LenpredError(f"{path} is not a readable lenpred predictor ({type(exc).__name__}); retrain it") from None
        predictor = make_predictor(name, **params)
        predictor._set_state(tensors, info)
        return predictor


def num_prompt_tokens(requests: list[Request]) -> np.ndarray:
    """``(n,)`` float64 prompt lengths in tokens."""
    return np.array([r.num_prompt_tokens for r in requests], dtype=np.float64)


def max_new_tokens(requests: list[Request]) -> np.ndarray:
    """``(n,)`` float64 generation caps in tokens (``inf`` where a request has none)."""
    return np.array([np.inf if r.max_new_tokens is None else r.max_new_tokens for r in requests], dtype=np.float64)


def distinct_requests(requests: list[Request]) -> tuple[list[Request], np.ndarray]:
    """Distinct request objects in first-seen order (samples of a prompt share one) and, for every input row,
    the index of its object: ``(unique, owner)`` with ``owner`` ``(n,)`` int64 and ``requests[i] is
    unique[owner[i]]``. First-seen order (never memory addresses) keeps seeded training reproducible."""
    index: dict[int, int] = {}
    unique: list[Request] = []
    owner = np.empty(len(requests), dtype=np.int64)
    for i, r in enumerate(requests):
        if id(r) not in index:
            index[id(r)] = len(unique)
            unique.append(r)
        owner[i] = index[id(r)]
    return unique, owner


def unique_map(requests: list[Request], fn: Callable[[Request], Any]) -> list:
    """``[fn(r) for r in requests]``, calling ``fn`` once per distinct object (samples of a prompt share one)."""
    unique, owner = distinct_requests(requests)
    values = [fn(r) for r in unique]
    return [values[o] for o in owner]
