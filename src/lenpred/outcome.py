"""How one served request ended (:class:`RequestOutcome`): the per-request record every serving path keeps — the
proxy's ``on_finished`` hooks (:class:`lenpred.serving.proxy.state.FinishedRequest` extends it), the vLLM plug-in's
per-request log, and the traffic log's rows (:meth:`lenpred.online.learning.OnlineLearning.finished` joins it to the
prediction served; the field names are the traffic log's column names)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class RequestOutcome:
    """One finished request, in the field's terms (times are wall-clock Unix seconds, ``time.time()``).

    Attributes:
        request_id: the id the engine served it under.
        num_prompt_tokens: the chat-formatted prompt's length (``None``: not known where it finished).
        num_output_tokens: tokens generated, EOS excluded (``None``: unknown, e.g. a stream without usage); a lower
            bound on the natural length when ``finish_reason`` is ``"length"``.
        finish_reason: lower-case, as OpenAI-compatible servers and vLLM report it: ``"stop"``, ``"length"`` (hit
            ``max_new_tokens``), ``"abort"``, ``"error"``, ...; ``None`` when none was reported.
        max_new_tokens: the generation cap it was served with (``None``: uncapped).
        arrival_time_s: when it arrived.
        first_token_time_s: when its first output token (or body chunk) came (``None``: none came).
        finish_time_s: when it ended.
    """

    request_id: str
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None
    finish_reason: str | None
    max_new_tokens: int | None
    arrival_time_s: float
    first_token_time_s: float | None
    finish_time_s: float

    @property
    def jct_s(self) -> float:
        """Job completion time, seconds: ``finish_time_s - arrival_time_s``."""
        return self.finish_time_s - self.arrival_time_s
