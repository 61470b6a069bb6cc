"""What `lenpred serve` adds to a request's latency, before and after batched, truncated predictions.

Usage: flock /tmp/lenpred-cpu.lock python scripts/proxy_latency.py [--before 09b1c3b] [--rounds 20,6,3]
       [--proxy-cpus 1 --client-cpus 0] [--out results/scripts/serve/proxy_latency.json]

A local OpenAI-style upstream (Starlette under uvicorn, in this process) records when each request reaches it and
answers at once with a one-token stream. The proxy runs in its own process with the shipped predictor and one torch
thread: ``before`` is ``src/lenpred/serving/proxy/app.py`` at git revision ``--before`` (one prediction at a time behind a lock,
full prefill), ``after`` is this checkout's (micro-batched worker, truncated forward). Bursts of 1, 8 and 32
concurrent short chat requests (Vicuna-bench questions from the data directory) are sent ``--rounds`` times each,
through the proxy and straight to the upstream.

Reported per implementation and concurrency:

* prediction latency (the proxy's ``x-lenpred-predict-ms``: tokenising, queueing and the forward) p50 / p90 / p99;
* added latency: upstream arrival − client send (what the proxy held the request for), p50 / p90 / p99;
* added TTFT: TTFT through the proxy − TTFT straight to the upstream at the same concurrency, p50 and p90;
* the target: added latency p90 at 32 concurrent ≤ 2 × one request's prediction time (``after`` at 1, p50).

It also times the prediction itself in this process: ``LengthPredictor.predict`` with ``truncated=False`` (full
prefill with the LM head for the entropy) against its default, the truncated forward, without and with the
template-prefix cache, for one prompt and for 32 at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpus(spec: str | None) -> set[int] | None:
    return None if spec is None else {int(c) for c in spec.split(",")}


def short_prompts(data_dir: str, n: int = 64) -> list[str]:
    """The first ``n`` Vicuna-bench questions (short chat requests)."""
    lines = (Path(data_dir) / "vicuna_bench" / "question.jsonl").read_text().splitlines()
    return [json.loads(line)["turns"][0] for line in lines[:n]]


# ------------------------------------------------------------------ the proxy process

def serve_proxy(impl: str, module: str | None, upstream: str, port: int) -> None:
    """Run one implementation of the proxy (``before``: the module file from git; ``after``: this checkout)."""
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


# ------------------------------------------------------------------ upstream and client (this process)

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


def _q(values, qs=(50, 90, 99)) -> dict[str, float | None]:
    x = np.asarray([v for v in values if v is not None], dtype=float)
    return {f"p{q}": (float(np.percentile(x, q)) if x.size else None) for q in qs}


def summarize(rows: dict[int, list[dict]], direct: dict[int, list[dict]]) -> dict:
    out = {}
    for conc, rs in rows.items():
        ttft = _q([r["ttft_s"] * 1e3 for r in rs], (50, 90))
        base = _q([r["ttft_s"] * 1e3 for r in direct[conc]], (50, 90))
        out[conc] = {"n": len(rs), "predict_ms": _q([r["predict_ms"] for r in rs]),
                     "added_ms": _q([r["added_s"] * 1e3 for r in rs]), "ttft_ms": ttft, "direct_ttft_ms": base,
                     "added_ttft_ms": {k: ttft[k] - base[k] for k in ttft}}
    return out


def run_proxy_bench(impl: str, module: str | None, upstream_url: str, upstream: Upstream, prompts, rounds,
                    direct, proxy_cpus) -> dict:
    port = _free_port()
    cmd = [sys.executable, __file__, "--serve-proxy", impl, "--upstream", upstream_url, "--port", str(port)]
    cmd += ["--module", module] if module else []
    pre = (lambda: os.sched_setaffinity(0, proxy_cpus)) if proxy_cpus else None
    proc = subprocess.Popen(cmd, preexec_fn=pre, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        import httpx

        for _ in range(600):
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise SystemExit(f"the {impl} proxy exited ({proc.returncode})")
                time.sleep(0.5)
        rows = asyncio.run(measure(f"http://127.0.0.1:{port}", upstream, prompts, rounds, impl))
    finally:
        proc.terminate()
        proc.wait(30)
    return summarize(rows, direct)


def time_predictions(prompts: list[str], repeats: int = 20) -> dict:
    """In-process ms of one prompt and of 32 prompts: ``predict`` with the full prefill vs the truncated forward."""
    from lenpred.pipeline import LengthPredictor

    lp = LengthPredictor.from_pretrained(threads=1)

    def ms(fn, n):
        fn()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
        return float(np.median(times))

    from lenpred.truncated import PrefixCache

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


def markdown(report: dict) -> str:
    from lenpred.tables import markdown_table

    f = lambda d, ks: " / ".join("–" if d[k] is None else f"{d[k]:.0f}" for k in ks)  # noqa: E731
    rows = [[impl, conc, s["n"], f(s["predict_ms"], ("p50", "p90", "p99")), f(s["added_ms"], ("p50", "p90", "p99")),
             f(s["added_ttft_ms"], ("p50", "p90"))] for impl in ("before", "after") for conc, s in report[impl].items()]
    lines = [markdown_table(["impl", "concurrent", "n", "predict ms p50 / p90 / p99", "added ms p50 / p90 / p99",
                             "added TTFT ms p50 / p90"], rows, "lrrlll")]
    t, p = report["target"], report["predictions"]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="09b1c3b",
                    help="git revision of the 'before' serve.py (09b1c3b: the last with one prediction at a time)")
    ap.add_argument("--rounds", default="20,6,3", help="bursts at 1, 8 and 32 concurrent requests")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets"))
    ap.add_argument("--proxy-cpus", default=None, help="CPU ids of the proxy process, e.g. 1")
    ap.add_argument("--client-cpus", default=None, help="CPU ids of this process (upstream + client), e.g. 0")
    ap.add_argument("--out", default="results/scripts/serve/proxy_latency.json")
    ap.add_argument("--serve-proxy", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--module", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--upstream", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_proxy:
        return serve_proxy(args.serve_proxy, args.module, args.upstream, args.port)

    import uvicorn

    from lenpred.io import atomic_path, write_json

    if args.client_cpus:
        os.sched_setaffinity(0, _cpus(args.client_cpus))
    rounds = dict(zip((1, 8, 32), (int(x) for x in args.rounds.split(","))))
    prompts = short_prompts(args.data_dir)
    upstream = Upstream()
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(upstream.app(), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    direct = asyncio.run(measure(url, upstream, prompts, rounds, "direct"))
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "serve_before.py"
        before.write_text(subprocess.run(["git", "show", f"{args.before}:src/lenpred/serving/proxy/app.py"], cwd=ROOT, check=True,
                                         capture_output=True, text=True).stdout)
        report = {"before_revision": subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT,
                                                    capture_output=True, text=True).stdout.strip(),
                  "after_revision": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                                   capture_output=True, text=True).stdout.strip(),
                  "rounds": rounds, "proxy_cpus": args.proxy_cpus, "client_cpus": args.client_cpus}
        for impl in ("before", "after"):
            report[impl] = run_proxy_bench(impl, str(before) if impl == "before" else None, url, upstream, prompts,
                                           rounds, direct, _cpus(args.proxy_cpus))
            print(impl, json.dumps(report[impl][32]), flush=True)
    server.should_exit = True
    report["predictions"] = time_predictions(prompts)
    one = report["after"][1]["predict_ms"]["p50"]
    added = report["after"][32]["added_ms"]["p90"]
    report["target"] = {"one_prediction_ms": one, "added_p90_32_ms": added, "met": bool(added <= 2 * one)}
    out = Path(args.out)
    write_json(out, report)
    with atomic_path(out.with_suffix(".md")) as tmp:
        tmp.write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
