"""What ``lenpred serve`` adds to a request's latency, before and after batched, truncated predictions
(``scripts/proxy_latency.py``).

A local OpenAI-style upstream (Starlette under uvicorn, in this process: :class:`Upstream`) records when each request
reaches it and answers at once with a one-token stream. The proxy runs in its own process with the shipped predictor
and one torch thread: ``before`` is ``src/lenpred/serving/proxy/app.py`` at git revision ``before`` (one prediction
at a time behind a lock, full prefill), ``after`` is this checkout's (micro-batched worker, truncated forward).
Bursts of 1, 8 and 32 concurrent short chat requests (Vicuna-bench questions) are sent ``rounds`` times each,
through the proxy and straight to the upstream.

Reported per implementation and concurrency (:func:`summarize`): the prediction latency (the proxy's
``x-lenpred-predict-ms``: tokenising, queueing and the forward), the added latency (upstream arrival − client send),
the added TTFT (through the proxy − straight to the upstream at the same concurrency); the target (added latency p90
at 32 concurrent ≤ 2 × one request's prediction time, ``after`` at 1, p50); and the prediction timed in this process
(:func:`time_predictions`).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lenpred.errors import LenpredError
from lenpred.io import atomic_path, write_json
from lenpred.studies import report_dict
from lenpred.tables import markdown_table

SRC = Path(__file__).resolve().parents[2]
"""This checkout's ``src/`` (the ``after`` proxy's ``PYTHONPATH``); its parent is the git work tree."""
CONCURRENCY = (1, 8, 32)
"""Requests per burst."""


@dataclass
class ProxyLatencyConfig:
    """Settings of the proxy-latency benchmark."""

    before: str = "09b1c3b"
    """Git revision of the ``before`` proxy app (09b1c3b: the last with one prediction at a time)."""
    rounds: tuple[int, ...] = (20, 6, 3)
    """Bursts sent at each of :data:`CONCURRENCY` (1, 8 and 32 concurrent requests)."""
    data_dir: str | None = None
    """Prompt data sets (``None``: ``$LENPRED_DATA_DIR`` or ``../shared/datasets``)."""
    proxy_cpus: str | None = None
    """CPU ids of the proxy process, e.g. ``"1"`` (``None``: not pinned)."""
    client_cpus: str | None = None
    """CPU ids of this process (upstream and client), e.g. ``"0"`` (``None``: not pinned)."""
    out: str = "results/scripts/serve/proxy_latency.json"
    """The report's JSON; the Markdown goes beside it (``.md``)."""

    def __post_init__(self):
        if len(self.rounds) != len(CONCURRENCY) or min(self.rounds) < 1:
            raise LenpredError(f"rounds: one count >= 1 per concurrency {CONCURRENCY}, got {self.rounds}")


@dataclass
class ProxyLatencyReport:
    """The benchmark's report; :meth:`to_dict` is the JSON (concurrencies become string keys there)."""

    before_revision: str
    """``before``'s short git revision."""
    after_revision: str
    """This checkout's short git revision (``HEAD``)."""
    rounds: dict
    """Concurrency -> bursts sent."""
    proxy_cpus: str | None
    """As configured."""
    client_cpus: str | None
    """As configured."""
    before: dict
    """Concurrency -> :func:`summarize`'s cell of the ``before`` proxy (milliseconds)."""
    after: dict
    """The same of the ``after`` proxy."""
    predictions: dict
    """:func:`time_predictions` (milliseconds, token counts)."""
    target: dict
    """``one_prediction_ms`` (after, 1 concurrent, p50), ``added_p90_32_ms`` and whether ``met``."""

    def to_dict(self) -> dict:
        return report_dict(self)


def short_prompts(data_dir: str | None, n: int = 64) -> list[str]:
    """The first ``n`` Vicuna-bench questions (short chat requests)."""
    from lenpred.bench.sources import default_data_dir

    lines = (Path(data_dir or default_data_dir()) / "vicuna_bench" / "question.jsonl").read_text().splitlines()
    return [json.loads(line)["turns"][0] for line in lines[:n]]


def serve_proxy(impl: str, module: str | None, upstream: str, port: int) -> None:
    """Serve one implementation of the proxy on ``port`` (``before``: the app module file ``module`` from git;
    ``after``: this checkout's) with the shipped predictor on one torch thread: the proxy process's entry point."""
    import importlib.util

    import uvicorn

    from lenpred.pipeline import LengthPredictor

    model = LengthPredictor.from_pretrained(threads=1)
    if impl == "before":
        spec = importlib.util.spec_from_file_location("lenpred_serve_before", module)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        app = old.create_app(upstream, old.predictor_fn(model))
    else:
        from lenpred.serving.proxy.app import create_app
        from lenpred.serving.proxy.batching import LengthPredictorService

        app = create_app(upstream, LengthPredictorService(model))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class Upstream:
    """Records ``perf_counter`` at each request's arrival (keyed by its ``x-bench-id`` header) and streams one token."""

    def __init__(self):
        self.arrived: dict[str, float] = {}

    def app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        async def chat(request):
            self.arrived[request.headers.get("x-bench-id", "")] = time.perf_counter()
            await request.body()

            async def events():
                yield b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
                yield b"data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")

        async def models(request):
            return JSONResponse({"data": []})
        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpus(spec: str | None) -> set[int] | None:
    return None if spec is None else {int(c) for c in spec.split(",")}


async def _burst(client, url: str, prompts: list[str], tag: str) -> list[dict]:
    async def one(i: int, prompt: str) -> dict:
        bench_id = f"{tag}-{i}"
        body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 256, "stream": True}
        sent = time.perf_counter()
        first = None
        async with client.stream("POST", url, json=body, headers={"x-bench-id": bench_id}) as r:
            predict_ms = r.headers.get("x-lenpred-predict-ms")
            async for line in r.aiter_lines():
                if first is None and '"content"' in line:
                    first = time.perf_counter()
        return {"id": bench_id, "sent": sent, "ttft_s": first - sent,
                "predict_ms": None if predict_ms is None else float(predict_ms)}
    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


async def measure(base: str, upstream: Upstream, prompts: list[str], rounds: dict[int, int], label: str) -> dict:
    """Bursts at each concurrency; per request TTFT, prediction ms and (through the proxy) the added latency."""
    import httpx

    out = {}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        url = base + "/v1/chat/completions"
        await _burst(client, url, prompts[:8], f"{label}-warm")
        for conc, n in rounds.items():
            rows = []
            for k in range(n):
                batch = [prompts[(k * conc + j) % len(prompts)] for j in range(conc)]
                res = await _burst(client, url, batch, f"{label}-{conc}-{k}")
                for r in res:
                    r["added_s"] = upstream.arrived[r["id"]] - r["sent"]
                rows += res
            out[conc] = rows
    return out


def quantiles(values, qs=(50, 90, 99)) -> dict[str, float | None]:
    """``{"p50": ..., ...}`` of the values that are not ``None`` (``None`` when there are none)."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    return {f"p{q}": (float(np.percentile(x, q)) if x.size else None) for q in qs}


def summarize(rows: dict[int, list[dict]], direct: dict[int, list[dict]]) -> dict:
    """Per concurrency: requests, prediction ms, added ms and TTFT ms (through the proxy, straight, added)."""
    out = {}
    for conc, rs in rows.items():
        ttft = quantiles([r["ttft_s"] * 1e3 for r in rs], (50, 90))
        base = quantiles([r["ttft_s"] * 1e3 for r in direct[conc]], (50, 90))
        out[conc] = {"n": len(rs), "predict_ms": quantiles([r["predict_ms"] for r in rs]),
                     "added_ms": quantiles([r["added_s"] * 1e3 for r in rs]), "ttft_ms": ttft, "direct_ttft_ms": base,
                     "added_ttft_ms": {k: ttft[k] - base[k] for k in ttft}}
    return out


def _wait_for_proxy(proc, port: int, impl: str) -> None:
    import httpx

    for _ in range(600):
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
            return
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise LenpredError(f"the {impl} proxy exited ({proc.returncode})")
            time.sleep(0.5)


def run_proxy_bench(impl: str, module: str | None, upstream_url: str, upstream: Upstream, prompts, rounds,
                    direct, proxy_cpus) -> dict:
    """Start one proxy (:func:`serve_proxy`, in its own process pinned to ``proxy_cpus``), measure, stop it."""
    port = _free_port()
    code = (f"from lenpred.studies.proxy_latency import serve_proxy; "
            f"serve_proxy({impl!r}, {module!r}, {upstream_url!r}, {port})")
    pre = (lambda: os.sched_setaffinity(0, proxy_cpus)) if proxy_cpus else None
    proc = subprocess.Popen([sys.executable, "-c", code], preexec_fn=pre, env={**os.environ, "PYTHONPATH": str(SRC)})
    try:
        _wait_for_proxy(proc, port, impl)
        rows = asyncio.run(measure(f"http://127.0.0.1:{port}", upstream, prompts, rounds, impl))
    finally:
        proc.terminate()
        proc.wait(30)
    return summarize(rows, direct)


def time_predictions(prompts: list[str], repeats: int = 20) -> dict:
    """In-process ms of one prompt and of 32 prompts: ``predict`` with the full prefill vs the truncated forward,
    without and with the template-prefix cache (median of ``repeats`` calls; 3 for 32 prompts)."""
    from lenpred.pipeline import LengthPredictor
    from lenpred.truncated import PrefixCache

    lp = LengthPredictor.from_pretrained(threads=1)

    def ms(fn, n):
        fn()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
        return float(np.median(times))

    one, many, cache = prompts[:1], prompts[:32], PrefixCache()
    full, cut = (lambda p: lp.predict(p, 256, truncated=False)), (lambda p, c=None: lp.predict(p, 256, prefix_cache=c))
    return {"one_full_ms": ms(lambda: full(one), repeats),
            "one_truncated_ms": ms(lambda: cut(one), repeats),
            "one_truncated_prefix_cached_ms": ms(lambda: cut(one, cache), repeats),
            "batch32_full_ms": ms(lambda: full(many), 3),
            "batch32_truncated_ms": ms(lambda: cut(many), 3),
            "batch32_truncated_prefix_cached_ms": ms(lambda: cut(many, cache), 3),
            "prefix_tokens": min(r.content_span[0] for r in lp.prepare(many, 256)),
            "prompt_tokens_one": lp.prepare(one, 256)[0].num_prompt_tokens,
            "prompt_tokens_32_mean": float(np.mean([r.num_prompt_tokens for r in lp.prepare(many, 256)]))}


def render_markdown(report: ProxyLatencyReport) -> str:
    """The Markdown beside the JSON: the latency table, the target's verdict, the in-process prediction times."""
    f = lambda d, ks: " / ".join("–" if d[k] is None else f"{d[k]:.0f}" for k in ks)  # noqa: E731
    rows = [[impl, conc, s["n"], f(s["predict_ms"], ("p50", "p90", "p99")), f(s["added_ms"], ("p50", "p90", "p99")),
             f(s["added_ttft_ms"], ("p50", "p90"))]
            for impl, cells in (("before", report.before), ("after", report.after)) for conc, s in cells.items()]
    lines = [markdown_table(["impl", "concurrent", "n", "predict ms p50 / p90 / p99", "added ms p50 / p90 / p99",
                             "added TTFT ms p50 / p90"], rows, "lrrlll")]
    t, p = report.target, report.predictions
    lines += ["", f"Target: added latency p90 at 32 concurrent ≤ 2 × one request's prediction time (after, 1 "
              f"concurrent, p50 = {t['one_prediction_ms']:.0f} ms): {t['added_p90_32_ms']:.0f} ms vs "
              f"{2 * t['one_prediction_ms']:.0f} ms → {'met' if t['met'] else 'NOT met'}.",
              "", f"In-process prediction, one torch thread (median ms): one prompt ({p['prompt_tokens_one']} "
              f"tokens) full {p['one_full_ms']:.1f}, truncated {p['one_truncated_ms']:.1f}, truncated with the "
              f"{p['prefix_tokens']}-token template prefix cached {p['one_truncated_prefix_cached_ms']:.1f}; 32 "
              f"prompts at once (mean {p['prompt_tokens_32_mean']:.0f} tokens) full {p['batch32_full_ms']:.0f}, "
              f"truncated {p['batch32_truncated_ms']:.0f}, truncated + prefix cache "
              f"{p['batch32_truncated_prefix_cached_ms']:.0f}."]
    return "\n".join(lines) + "\n"


def save(report: ProxyLatencyReport, out: str | Path) -> None:
    """``out`` (the JSON) and the Markdown beside it."""
    write_json(out, report.to_dict())
    with atomic_path(Path(out).with_suffix(".md")) as tmp:
        tmp.write_text(render_markdown(report))


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=SRC.parent, check=True, capture_output=True, text=True).stdout


def _start_upstream(upstream: Upstream):
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(upstream.app(), host="127.0.0.1", port=_free_port(), log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, f"http://127.0.0.1:{server.config.port}"


def run(cfg: ProxyLatencyConfig) -> ProxyLatencyReport:
    """Measure both proxies and the in-process predictions; the report is written to ``cfg.out`` (:func:`save`).
    Pins this process to ``cfg.client_cpus`` when given."""
    if cfg.client_cpus:
        os.sched_setaffinity(0, _cpus(cfg.client_cpus))
    rounds = dict(zip(CONCURRENCY, cfg.rounds))
    prompts = short_prompts(cfg.data_dir)
    upstream = Upstream()
    server, url = _start_upstream(upstream)
    direct = asyncio.run(measure(url, upstream, prompts, rounds, "direct"))
    cells = {}
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "serve_before.py"
        before.write_text(_git("show", f"{cfg.before}:src/lenpred/serving/proxy/app.py"))
        for impl in ("before", "after"):
            cells[impl] = run_proxy_bench(impl, str(before) if impl == "before" else None, url, upstream, prompts,
                                          rounds, direct, _cpus(cfg.proxy_cpus))
            print(impl, json.dumps(cells[impl][32]), flush=True)
    server.should_exit = True
    one, added = cells["after"][1]["predict_ms"]["p50"], cells["after"][32]["added_ms"]["p90"]
    report = ProxyLatencyReport(_git("rev-parse", "--short", cfg.before).strip(),
                                _git("rev-parse", "--short", "HEAD").strip(), rounds, cfg.proxy_cpus,
                                cfg.client_cpus, cells["before"], cells["after"], time_predictions(prompts),
                                {"one_prediction_ms": one, "added_p90_32_ms": added, "met": bool(added <= 2 * one)})
    save(report, cfg.out)
    return report
