"""The plug-in's settings: ``--additional-config '{"lenpred": {...}}'`` on the ``vllm serve`` command line (or
``additional_config={"lenpred": {...}}`` in ``vllm.LLM``), read by the worker and the scheduler alike."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from lenpred.backbone import local_model_revision
from lenpred.errors import LenpredError, raise_first
from lenpred.online.capture import HEADLESS, HeadlessCapture, capture_layer
from lenpred.pipeline import LengthPredictor
from lenpred.serving.parked import SchedulerConfig
from lenpred.serving.policies import POLICIES, Policy, check_policy_options

OBSERVE = "observe"
"""The policy that captures and predicts but schedules as stock vLLM (the overhead reference)."""

KEY = "lenpred"
RANK_BY = ("prediction", "priority")
MISSING_STATE = ("unpredicted", "refuse")


@dataclass
class EngineConfig(SchedulerConfig):
    """Settings of the vLLM plug-in: the parked-decoding settings it shares with the simulator
    (:class:`lenpred.serving.parked.SchedulerConfig`: ``policy``, ``decode_slots``, ``prefill_ahead``, ``admit_by``,
    ``max_idle_s``, ``switch_margin_tokens``, ``aging_tokens_per_s``; their defaults are the design measured on the
    engine), and the plug-in's own below.

    Keep vLLM's ``--max-num-seqs`` at ``decode_slots + prefill_ahead`` (it bounds the *admitted* requests: decoding,
    parked and prefilling). ``admit_by: prompt_len`` (the default) sets each waiting request's vLLM ``priority`` to
    its prompt length, so vLLM must run with ``--scheduling-policy priority`` (refused at start-up otherwise); a
    client's own ``priority`` is then ignored for admission (``rank_by: priority`` still reads it). Behind ``lenpred
    serve --aging-tokens-per-s`` with ``rank_by: priority`` leave ``aging_tokens_per_s`` 0: the priority already
    carries the proxy's aging.

    Attributes:
        policy: ``observe`` (capture and predict, schedule as stock vLLM) or a registered policy
            (:func:`engine_policies`).
        predictor: a directory written by ``lenpred train`` (``None``: the predictor that ships with lenpred). Its
            input must be one last-prompt-token state (:attr:`lenpred.LengthPredictor.engine_layer`). ``"none"``:
            no head (a model lenpred has none for, :mod:`lenpred.online.capture`): with ``policy: observe`` and a
            ``traffic_log``, the plug-in captures each request's state at :attr:`capture_layer` and logs it with the
            outcome, for ``lenpred train --traffic`` to train the first head on.
        capture_layer: with ``predictor: "none"``, the hidden-state index captured (a decoder layer's output,
            1 .. depth − 1); ``None``: half the served model's depth (:func:`lenpred.online.capture.capture_layer`).
            Refused with a head (the head fixes its layer).
        plp: refresh the remaining-length estimate with the predictor's PLP head from decode states captured at its
            steps (for a policy that ranks by remaining length, ``srpt``: :attr:`refreshes_remaining`). Off by
            default, as measured: ``srpt`` then ranks by the static distribution conditioned on the tokens generated
            so far, which needs no decode-state capture.
        rank_by: ``prediction`` (the engine's own, default) or ``priority``: rank by each request's ``priority`` field
            as its predicted output length in tokens (remaining = priority − generated) — for a router or proxy that
            predicts upstream, and for oracle runs (priority = the recorded length); the engine still predicts and
            logs its own.
        log_path: append one JSON line per finished request (predictions, observed length, times) to this file;
            ``None``: no log. Holds no prompt or response text.
        traffic_log: a directory: log every finished request for learning from served traffic
            (:mod:`lenpred.online.traffic_log`: the captured state the head read, the prediction, the observed length;
            rotating checksummed parquet parts, no text); ``None``: off. ``lenpred train --traffic DIR`` refits on it.
        adaptive_interval: ``aci`` or ``rolling``: the served ``[low, high]`` interval's margin adapts online to the
            finished requests (:mod:`lenpred.online.adaptive`); ``None``: the predictor's fixed calibrated margin.
        log_states: also write each request's captured prefill state (``(d,)`` floats) into its log line — a
            diagnostic for comparing with transformers; hidden states can be inverted towards the prompt, so treat
            such a log as sensitive as the prompts themselves.
        on_missing_state: what becomes of a request whose prefill ended without the worker's captured state (a
            worker without the plug-in's capture, a row it could not place): each one is counted
            (``lenpred_counters["missing_states"]``) and logged as an error naming the request; then ``unpredicted``
            (default): it is served without a prediction, ranked after every predicted request (and still subject to
            the starvation guard); ``refuse``: it is finished with vLLM's ``FINISHED_ERROR`` (the client gets an
            error, the KV blocks are freed).
    """

    predictor: str | None = None
    capture_layer: int | None = None
    plp: bool = False
    rank_by: str = "prediction"
    log_path: str | None = None
    traffic_log: str | None = None
    adaptive_interval: str | None = None
    log_states: bool = False
    on_missing_state: str = "unpredicted"

    def __post_init__(self):
        super().__post_init__()
        for name, valid in (("rank_by", RANK_BY), ("on_missing_state", MISSING_STATE),
                            ("adaptive_interval", (None, "aci", "rolling"))):
            if getattr(self, name) not in valid:
                raise LenpredError(f"lenpred {name} {getattr(self, name)!r} is unknown; valid: "
                                   f"{', '.join(str(v) for v in valid)}")
        for name in ("plp", "log_states"):
            if not isinstance(getattr(self, name), bool):
                raise LenpredError(f"lenpred {name} must be true or false, got {getattr(self, name)!r}")
        if self.capture_layer is not None and (not isinstance(self.capture_layer, int)
                                               or isinstance(self.capture_layer, bool) or self.capture_layer < 1):
            raise LenpredError(f"lenpred capture_layer must be an integer >= 1 (a decoder layer's output) or null, got "
                               f"{self.capture_layer!r}")
        if self.headless:
            raise_first([(self.policy != OBSERVE, f"lenpred predictor none (no head) has nothing to rank by: use "
                          f"policy observe (not {self.policy!r}) to log traffic, then `lenpred train --traffic` and "
                          "serve with the head it writes"),
                         (not self.traffic_log, "lenpred predictor none (no head) serves no prediction: set "
                          "traffic_log to a directory, the log a head is trained on"),
                         (self.adaptive_interval is not None or self.plp or self.rank_by != "prediction",
                          "lenpred predictor none (no head) takes no adaptive_interval, plp or rank_by: there is no "
                          "prediction to adapt, refresh or rank")])
        elif self.capture_layer is not None:
            raise LenpredError("lenpred capture_layer is for predictor none (no head); a head reads the layer it was "
                               "trained on: leave capture_layer out")

    @property
    def headless(self) -> bool:
        """Serving with no head (``predictor: "none"``): capture and log only."""
        return self.predictor == HEADLESS

    def check_policy(self) -> None:
        """Refuse a policy other than ``observe`` and the registered ones (the message lists them), or an option
        the policy does not have (:attr:`policy_options`)."""
        if self.policy not in engine_policies():
            raise LenpredError(f"lenpred policy {self.policy!r} is unknown; valid: {', '.join(engine_policies())}")
        if self.policy != OBSERVE:
            check_policy_options(self.policy, self.policy_options)

    def engine_policy(self) -> Policy | None:
        """The policy the plug-in schedules with (resolve it once, at start-up); ``None`` for ``observe``."""
        return None if self.policy == OBSERVE else self.make_policy()

    @property
    def refreshes_remaining(self) -> bool:
        """Whether the engine captures PLP's decode states: :attr:`plp` on and a policy that ranks by remaining
        length (:attr:`lenpred.serving.policies.Policy.reads_remaining`). The worker and the scheduler both read
        it, so they agree."""
        return self.plp and self.policy != OBSERVE and POLICIES[self.policy].reads_remaining

    @classmethod
    def from_vllm(cls, vllm_config) -> "EngineConfig":
        """Read ``vllm_config.additional_config["lenpred"]`` (absent: the defaults).

        Raises:
            LenpredError: not a JSON object, an unknown key (the message lists the valid ones), or a bad value."""
        raw = (getattr(vllm_config, "additional_config", None) or {}).get(KEY, {})
        if isinstance(raw, str):
            raw = json.loads(raw)
        if not isinstance(raw, dict):
            raise LenpredError(f"--additional-config '{KEY}' must be a JSON object, got {type(raw).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(raw) - set(names))
        if unknown:
            raise LenpredError(f"unknown lenpred setting(s) {', '.join(unknown)} in --additional-config; valid: "
                               f"{', '.join(names)}")
        return cls(**raw)

    def to_json(self) -> str:
        """The ``--additional-config`` value that gives these settings."""
        return json.dumps({KEY: asdict(self)})


def engine_policies() -> tuple[str, ...]:
    """The valid :attr:`EngineConfig.policy` names: ``observe`` and every registered policy, read when a config is
    validated (a policy registered later is valid from then on)."""
    return (OBSERVE, *POLICIES)


def load_head(cfg: EngineConfig, vllm_config):
    """The predictor without its backbone (``LengthPredictor.from_pretrained(..., load_model=False)``), checked
    against the served model (:func:`check_served_model`); with ``predictor: "none"``, the
    :class:`lenpred.online.capture.HeadlessCapture` of the served model at :attr:`EngineConfig.capture_layer`.

    Raises:
        LenpredError: unreadable, a predictor whose input an engine cannot capture (it pools many tokens, or
            reads entropy, attention or text), or one the served model does not fit."""
    if cfg.headless:
        predictor = headless_capture(cfg, vllm_config)
    else:
        predictor = engine_head(cfg)
    check_served_model(predictor, vllm_config)
    return predictor


def headless_capture(cfg: EngineConfig, vllm_config) -> HeadlessCapture:
    """What the plug-in captures with no head: the served directory's recorded name and revision, the layer
    (:attr:`EngineConfig.capture_layer` or half the depth) and the hidden size.

    Raises:
        LenpredError: the served model is not a local directory."""
    from lenpred.backbone import recorded_model_name
    from lenpred.prompts import TEMPLATE_RULE

    path = _served_dir(vllm_config)
    hf = vllm_config.model_config.hf_config
    layer = capture_layer(int(hf.num_hidden_layers)) if cfg.capture_layer is None else int(cfg.capture_layer)
    return HeadlessCapture(recorded_model_name(str(path)), local_model_revision(path), layer, int(hf.hidden_size),
                           TEMPLATE_RULE)


def _served_dir(vllm_config):
    from pathlib import Path

    model = vllm_config.model_config.model
    if not Path(model).is_dir():
        raise LenpredError(f"vLLM serves '{model}', not a local directory: serve the directory the predictor's model "
                           "was loaded from (e.g. `python -c 'from lenpred.backbone import resolve_model; "
                           "print(resolve_model()[0])'`)")
    return Path(model)


def engine_head(cfg: EngineConfig):
    """The predictor of ``cfg`` without its backbone (``LengthPredictor.from_pretrained(..., load_model=False)``).

    Raises:
        LenpredError: unreadable, or a predictor whose input an engine cannot capture."""
    predictor = LengthPredictor.from_pretrained(cfg.predictor, load_model=False)
    if predictor.engine_layer is None:
        raise LenpredError(f"predictor '{predictor.method}' ({cfg.predictor or 'shipped'}) reads more than the last "
                           "prompt token's state, which the vLLM plug-in cannot capture without a second pass: train a "
                           "`last` or `trail` predictor (`lenpred train --method last`)")
    return predictor


def check_served_model(predictor, vllm_config) -> None:
    """Refuse a predictor made for another model or revision than the one vLLM serves (with no head: a capture
    layer the model does not have).

    Raises:
        LenpredError: the served model directory's revision differs from the predictor's ``model_revision``, or its
            hidden size / depth cannot hold the predictor's layer."""
    path = _served_dir(vllm_config)
    hf = vllm_config.model_config.hf_config
    if isinstance(predictor, HeadlessCapture):
        width = predictor.width
    else:
        predictor.check_model_revision(local_model_revision(path), str(path), "the lenpred predictor")
        width = predictor.predictor_.n_features_in_
    layer, depth = predictor.engine_layer, int(hf.num_hidden_layers)
    if isinstance(predictor, HeadlessCapture) and not 1 <= layer < depth:
        raise LenpredError(f"lenpred capture_layer {layer} is not a decoder layer's output of this {depth}-layer "
                           f"model: set capture_layer to 1..{depth - 1}, or leave it out (half the depth)")
    if int(hf.hidden_size) != width:
        raise LenpredError(f"the predictor reads {width}-wide states; the served model's hidden size is {hf.hidden_size}")
    if not 1 <= layer < depth:
        raise LenpredError(f"the predictor reads hidden-state index {layer}; the plug-in captures decoder-layer outputs "
                           f"1..{depth - 1} of this {depth}-layer model (the last index holds the final norm's output, "
                           "which the hooks do not see): train the predictor on an intermediate layer")
