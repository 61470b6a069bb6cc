"""Predictions for ``lenpred serve`` off the request path's critical section: each request tokenises its prompt in
its own thread (:meth:`PredictionService.prepare`, no lock), then waits for one worker that predicts whatever has
queued up in micro-batches (:class:`PredictionBatcher`).

The worker takes the queue head, waits a short collection window (``window_ms``) if the batch is not full yet,
then takes queued requests in arrival order while they fit ``max_batch_tokens`` prompt tokens and
``max_batch_size`` requests, and predicts them in one call (:meth:`PredictionService.predict_batch`) on its own
thread, so the event loop keeps streaming other responses. Requests that arrive while a batch runs form the next
one. A request whose client went away before its batch started is dropped from the queue; one inside a running
batch has its result discarded.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from lenpred.errors import ContextWindowError, LenpredError


@dataclass
class BatchConfig:
    """Micro-batching of predictions.

    Attributes:
        window_ms: how long the idle worker waits after a request arrives for others to join its batch (ms). Short:
            it is added to a lone request's latency; under load the batch forms while the previous one runs.
        max_batch_tokens: prompt tokens per batch (the forward's cost grows with them; the service pads within
            groups of similar length).
        max_batch_size: requests per batch.
    """

    window_ms: float = 2.0
    max_batch_tokens: int = 8192
    max_batch_size: int = 64

    def __post_init__(self):
        if not self.window_ms >= 0:
            raise LenpredError(f"--batch-window-ms must be >= 0, got {self.window_ms}")
        if self.max_batch_tokens < 1:
            raise LenpredError(f"--max-batch-tokens must be >= 1, got {self.max_batch_tokens}")
        if self.max_batch_size < 1:
            raise LenpredError(f"max_batch_size must be >= 1, got {self.max_batch_size}")


@dataclass
class Prepared:
    """A request ready for prediction: what the service needs (``payload``) and its size.

    Attributes:
        payload: service-specific (tokenised requests, or the raw prompts for a plain function).
        num_tokens: prompt tokens (0 when unknown), for the batch-token limit.
        served: filled by a service that learns from its traffic (:class:`LengthPredictorService` with ``online``)
            once predicted: the request's :class:`lenpred.online.learning.ServedPrediction` (the interval served and
            the features to log when it finishes); ``None`` otherwise, and for a request of several prompts.
    """

    payload: Any
    num_tokens: int = 0
    served: Any = None


class PredictionService(Protocol):
    """What :class:`PredictionBatcher` drives."""

    def prepare(self, prompts: list, cap: int | None, group: str | None = None) -> Prepared:
        """Tokenise (any thread, concurrently; no shared mutable state); ``group``: the request's group key (used
        by a service that adapts its interval per group). Raises ``LenpredError``."""

    def predict_batch(self, items: list[Prepared]) -> list[float]:
        """Expected output tokens per item (the worker thread only). Raises ``LenpredError``."""


class FunctionService:
    """A plain ``predict(prompts, cap) -> expected tokens`` function as a service (tests, custom predictors): no
    tokenising, each item predicted by its own call."""

    def __init__(self, predict: Callable[[list, int | None], float]):
        self.predict = predict

    def prepare(self, prompts: list, cap: int | None, group: str | None = None) -> Prepared:
        return Prepared((prompts, cap))

    def predict_batch(self, items: list[Prepared]) -> list[float]:
        return [self.predict(*item.payload) for item in items]


class LengthPredictorService:
    """A loaded :class:`lenpred.LengthPredictor` as a service: the request's prompts tokenised with a copy of the
    tokenizer that no other thread uses meanwhile (taken from a pool of copies, never waited for); a batch predicted in
    one :meth:`~lenpred.LengthPredictor.predict` call (truncated forward for hidden-state-only predictors, the chat
    template's shared prefix computed once: :class:`lenpred.truncated.PrefixCache`). A request's value is its largest
    prompt's ``expected`` (a completions list of prompts).

    A cap that does not fit the predictor's context window next to the prompt (clients often send a large
    ``max_tokens`` to an upstream with a longer window) is not an error: the prediction is made uncapped and then
    clipped to the cap.

    ``online`` (a :class:`lenpred.online.learning.OnlineLearning`): each single-prompt request also gets its
    :class:`~lenpred.online.learning.ServedPrediction` in :attr:`Prepared.served`, from the features the head read
    in the same pass (pooling them again costs microseconds; no second forward). ``group`` of
    :meth:`prepare` is its Mondrian group key.
    """

    def __init__(self, predictor, truncated: bool = True, batch_tokens: int = 4096, prefix_cache: bool = True,
                 tokenizers: int = 4, online=None):
        import queue

        from lenpred.truncated import PrefixCache

        self.predictor, self.truncated, self.batch_tokens, self.online = predictor, truncated, batch_tokens, online
        self.prefix_cache = PrefixCache() if prefix_cache and truncated else None  # the worker thread's only
        # copies of the tokenizer, one per concurrent tokenisation: made up front (a copy of SmolLM2's takes ~0.3 s),
        # more only when more requests tokenise at once than there are copies (each then kept)
        self._tokenizers: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(tokenizers):
            self._tokenizers.put(self._copy())

    def _copy(self):
        import copy

        return copy.deepcopy(self.predictor.backbone_.tokenizer)

    def prepare(self, prompts: list, cap: int | None, group: str | None = None) -> Prepared:
        import queue

        try:
            tok = self._tokenizers.get_nowait()
        except queue.Empty:
            tok = self._copy()
        try:
            try:
                requests, clip = self.predictor.prepare(prompts, cap, tokenizer=tok), None
            except ContextWindowError:
                if cap is None:
                    raise
                requests, clip = self.predictor.prepare(prompts, None, tokenizer=tok), float(cap)
        finally:
            self._tokenizers.put(tok)
        return Prepared((requests, clip, cap, group), sum(r.num_prompt_tokens for r in requests))

    def warm_up(self) -> None:
        """One prediction, so the first request does not pay torch's first-call costs."""
        self.predict_batch([self.prepare(["Hello."], 16)])

    def predict_batch(self, items: list[Prepared]) -> list[float]:
        flat = [r for item in items for r in item.payload[0]]
        out = self.predictor.predict(flat, batch_tokens=self.batch_tokens, truncated=self.truncated,
                                     prefix_cache=self.prefix_cache, return_features=self.online is not None)
        predictions, features = out if self.online is not None else (out, None)  # the head's input: logged too
        out, row = [], 0
        for item in items:
            requests, clip = item.payload[:2]
            value = max(p.expected for p in predictions[row:row + len(requests)])
            out.append(value if clip is None else min(value, clip))
            row += len(requests)
        if self.online is not None:
            self.attach_served(items, features, predictions)
        return out

    def attach_served(self, items: list[Prepared], features, predictions: list) -> None:
        """Set :attr:`Prepared.served` of each single-prompt item (interval, features to log) from its row of
        ``features`` (``(n, d)`` float32) and of ``predictions`` (the ``n`` :class:`lenpred.prediction.LengthPrediction`
        of :meth:`predict_batch`'s head pass, reused: the head runs once per request), one row per request of
        ``items`` in order (an item of several prompts holds several rows and gets none)."""
        row = 0
        for item in items:
            requests, _, cap, group = item.payload
            if len(requests) == 1:
                p = predictions[row]
                if p.max_new_tokens != cap:  # predicted uncapped (the cap did not fit the window): serve the cap
                    p = replace(p, expected=min(p.expected, float(cap)), max_new_tokens=cap)
                item.served = self.online.serve(features[row:row + 1], [p], group=group)[0]
            row += len(requests)


class _Item:
    __slots__ = ("prepared", "future", "queued_s")

    def __init__(self, prepared: Prepared, future: asyncio.Future):
        self.prepared, self.future, self.queued_s = prepared, future, time.perf_counter()


class PredictionBatcher:
    """One worker predicting queued requests in micro-batches (see the module docstring).

    Call :meth:`start` inside the event loop (the app's lifespan), :meth:`predict` per request, :meth:`stop` at
    shutdown. ``metrics`` (a :class:`lenpred.serving.proxy.metrics.ProxyMetrics`) records batch sizes, batch times and the
    queue length.
    """

    def __init__(self, service: PredictionService, cfg: BatchConfig | None = None, metrics=None):
        self.service, self.cfg, self.metrics = service, cfg or BatchConfig(), metrics
        self._queue: collections.deque[_Item] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = None

    @property
    def queued(self) -> int:
        """Requests waiting for a batch."""
        return len(self._queue)

    @property
    def running(self) -> bool:
        """Whether the worker is alive."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="lenpred-predict")
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        for item in self._queue:
            item.future.cancel()
        self._queue.clear()

    async def predict(self, prepared: Prepared) -> float:
        """Queue one request and wait for its value (expected output tokens). Cancelling the caller drops it.

        Raises:
            LenpredError: its prediction failed (another request's failure in the same batch does not fail it).
        """
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Item(prepared, future))
        self._gauge()
        self._wake.set()
        return await future

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue.set(len(self._queue))

    def _take(self) -> list[_Item]:
        """The next batch: queued items in order while they fit (at least one); cancelled ones dropped."""
        batch, tokens = [], 0
        while self._queue and len(batch) < self.cfg.max_batch_size:
            item = self._queue[0]
            if item.future.done():  # its client went away
                self._queue.popleft()
                continue
            if batch and tokens + item.prepared.num_tokens > self.cfg.max_batch_tokens:
                break
            batch.append(self._queue.popleft())
            tokens += item.prepared.num_tokens
        self._gauge()
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            if self.cfg.window_ms > 0 and len(self._queue) < self.cfg.max_batch_size:
                await asyncio.sleep(self.cfg.window_ms / 1e3)
            batch = self._take()
            if not batch:
                continue
            started = time.perf_counter()
            values = await self._call(loop, batch)
            if self.metrics is not None:
                self.metrics.batch_s.observe(time.perf_counter() - started)
                self.metrics.batch_size.observe(len(batch))
            if isinstance(values, LenpredError):  # isolate the request that failed: predict each alone
                values = [values] if len(batch) == 1 else [await self._call(loop, [item]) for item in batch]
                values = [v if isinstance(v, LenpredError) else v[0] for v in values]
            for item, value in zip(batch, values):
                if item.future.done():
                    continue
                if isinstance(value, LenpredError):
                    item.future.set_exception(value)
                else:
                    item.future.set_result(value)

    async def _call(self, loop, batch: list[_Item]) -> list[float] | LenpredError:
        """The service's values for a batch, or the error it raised (any exception becomes a ``LenpredError``, so a
        bug in one batch never stops the worker)."""
        try:
            return await loop.run_in_executor(self._executor, self.service.predict_batch, [i.prepared for i in batch])
        except LenpredError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - reported to the requests, the worker goes on
            return LenpredError(f"the prediction failed ({type(exc).__name__}: {exc})")
