"""Serving metrics of one run (simulated or measured): per-request timings in, summary numbers out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lenpred.errors import LenpredError


@dataclass
class RequestTiming:
    """When one request arrived, got its first output token and finished (seconds since the run started).

    Attributes:
        request_id: the workload request.
        arrival_time_s, first_token_time_s, finish_time_s: seconds; ``finish − arrival`` is the job completion
            time (JCT), ``first_token − arrival`` the time to first token (TTFT).
        num_output_tokens: tokens the request generated (its true output length).
        num_preemptions: times it was preempted (recomputed on resumption).
        prompt_id: the benchmark prompt (bootstrap clusters).
    """

    request_id: int
    arrival_time_s: float
    first_token_time_s: float
    finish_time_s: float
    num_output_tokens: int
    num_preemptions: int = 0
    prompt_id: str = ""

    @property
    def jct_s(self) -> float:
        return self.finish_time_s - self.arrival_time_s

    @property
    def ttft_s(self) -> float:
        return self.first_token_time_s - self.arrival_time_s


def summarize(timings: list[RequestTiming], padding_ratio: float | None = None) -> dict[str, float | int | None]:
    """Throughput (output tokens / makespan, tok/s), mean / p50 / p90 / p99 JCT (s), mean / p50 / p90 TTFT (s),
    mean normalised latency (JCT per output token, s/token; Orca / vLLM papers' definition), makespan (first
    arrival to last finish, s), preemptions, and the given padding ratio (static batches; ``None`` otherwise).

    Raises:
        LenpredError: no requests.
    """
    if not timings:
        raise LenpredError("no requests to summarise: run a workload of at least one request")
    jct = np.array([t.jct_s for t in timings])
    ttft = np.array([t.ttft_s for t in timings])
    out = np.array([t.num_output_tokens for t in timings], dtype=np.float64)
    makespan = max(t.finish_time_s for t in timings) - min(t.arrival_time_s for t in timings)
    p = lambda x, q: float(np.percentile(x, q))  # noqa: E731
    return {"num_requests": len(timings), "num_output_tokens": int(out.sum()), "makespan_s": float(makespan),
            "throughput_tok_s": float(out.sum() / makespan) if makespan > 0 else None,
            "mean_jct_s": float(jct.mean()), "p50_jct_s": p(jct, 50), "p90_jct_s": p(jct, 90),
            "p99_jct_s": p(jct, 99), "mean_ttft_s": float(ttft.mean()), "p50_ttft_s": p(ttft, 50),
            "p90_ttft_s": p(ttft, 90), "mean_normalised_latency_s_per_tok": float(np.mean(jct / np.maximum(out, 1))),
            "num_preemptions": int(sum(t.num_preemptions for t in timings)), "padding_ratio": padding_ratio}
