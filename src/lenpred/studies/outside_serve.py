"""Serve prompts from outside the benchmark through the vLLM plug-in (issue 48, item 3): the engine's own traffic
log of a public prompt set none of the benchmark's sources holds (:mod:`lenpred.bench.outside_prompts`).

Each of ``num_prompts`` prompts (the set's seeded order) is sampled ``samples`` times with natural EOS at the
benchmark's long-form settings (temperature 0.7, top-p 1, a cap of 1,024 tokens), each sample with its own recorded
seed, so every prompt has a prompt oracle (the mean of its other samples). The requests reach a real vLLM engine
(``vllm.LLM``, float32, eager) with the plug-in in ``observe`` (the shipped head predicts, vLLM schedules as
stock) and its traffic log on, in arrival order: prompt after prompt, a prompt's samples together, so the stream's
later half holds prompts its earlier half never saw. The engine takes the requests in chunks of ``chunk_prompts``
prompts; after each chunk ``samples.parquet`` (one row per request: prompt id, sample, seed, prompt tokens, output
tokens, finish reason, the prompt's token-id SHA-256 that the log's ``prompt_sha256`` holds) is rewritten
atomically with its checksum, so a killed run resumes at the next chunk (a chunk cut short is served again: the
analysis keeps each prompt's latest rows). No prompt or response text is written.

Output under ``out``: ``samples.parquet`` (+ ``.sha256``) and ``traffic/`` (the plug-in's traffic log). The
analysis is :mod:`lenpred.studies.outside_source`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from lenpred.errors import LenpredError, raise_first

TEMPERATURE, TOP_P, CAP = 0.7, 1.0, 1024
"""The benchmark's long-form sampling settings (``bench.json``: longseq)."""


@dataclass
class OutsideServeConfig:
    """Settings of :func:`serve_outside` (``scripts/outside_source.py --serve``).

    Attributes:
        prompt_set: the set's name (:data:`lenpred.bench.outside_prompts.OUTSIDE_SETS`); prompt_sets_dir: the folder
            holding it (``None``: ``$LENPRED_PROMPT_SETS`` or ``~/.cache/lenpred/prompt_sets``).
        num_prompts: prompts served, in the set's seeded order (``order_seed``).
        samples: samples per prompt (seed ``seed_base + samples × prompt index + k``).
        chunk_prompts: prompts per engine call (the resume unit).
        max_num_seqs: vLLM's ``--max-num-seqs``; kv_cache_bytes: its KV cache.
        out: the output directory.
    """

    prompt_set: str = "hh_rlhf_helpful_base_test"
    prompt_sets_dir: str | None = None
    num_prompts: int = 640
    samples: int = 2
    order_seed: int = 0
    seed_base: int = 48_000
    chunk_prompts: int = 32
    max_num_seqs: int = 64
    kv_cache_bytes: int = 4 << 30
    out: str = "results/scripts/outside"

    def __post_init__(self):
        raise_first([(self.num_prompts < 2, "--num-prompts must be >= 2"),
                     (self.samples < 2, "--samples must be >= 2 (a prompt oracle needs another sample)"),
                     (self.chunk_prompts < 1 or self.max_num_seqs < 1, "--chunk-prompts and --max-num-seqs must be "
                      ">= 1")])


def serve_outside(cfg: OutsideServeConfig) -> Path:
    """Serve the missing chunks (module docstring); returns ``samples.parquet``'s path.

    Raises:
        LenpredError: the prompt set is missing or corrupt (:func:`lenpred.bench.outside_prompts.load_outside_prompts`),
            or ``samples.parquet`` was written with other settings (pass them, or another ``out``).
    """
    import pyarrow as pa
    from tqdm import tqdm

    from lenpred.backbone import resolve_model
    from lenpred.bench.outside_prompts import load_outside_prompts
    from lenpred.io import read_parquet_checked, write_parquet_checked
    from lenpred.online.traffic_log import token_ids_sha256
    from lenpred.prompts import chat_token_ids

    out = Path(cfg.out)
    path = out / "samples.parquet"
    prompts = load_outside_prompts(cfg.prompt_set, cfg.prompt_sets_dir, cfg.num_prompts, cfg.order_seed)
    settings = json.dumps({k: v for k, v in asdict(cfg).items() if k not in ("out", "chunk_prompts", "max_num_seqs")},
                          sort_keys=True)
    done = read_parquet_checked(path) if path.exists() else None
    rows = [] if done is None else done.to_pylist()
    if done is not None and (done.schema.metadata or {}).get(b"settings", b"").decode() != settings:
        raise LenpredError(f"{path} was served with other settings: pass them again, or another --out")
    from transformers import AutoTokenizer

    model_dir = str(resolve_model()[0])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = [chat_token_ids(tokenizer, p.text) for p in prompts]
    served = {r["prompt_id"] for r in rows}
    todo = [i for i, p in enumerate(prompts) if p.prompt_id not in served]
    llm = _engine(model_dir, cfg, out / "traffic") if todo else None
    with tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="outside prompts", unit="prompt") as bar:
        for start in range(0, len(todo), cfg.chunk_prompts):
            chunk = todo[start:start + cfg.chunk_prompts]
            reqs = [(i, k) for i in chunk for k in range(cfg.samples)]
            outs = llm.generate([{"prompt_token_ids": ids[i]} for i, _ in reqs],
                                [_params(cfg.seed_base + cfg.samples * i + k) for i, k in reqs], use_tqdm=False)
            for (i, k), o in zip(reqs, outs):
                c = o.outputs[0]
                rows.append({"order": i, "prompt_id": prompts[i].prompt_id, "sample": k,
                             "seed": cfg.seed_base + cfg.samples * i + k, "num_prompt_tokens": len(ids[i]),
                             "output_len": len(c.token_ids), "finish_reason": str(c.finish_reason),
                             "max_new_tokens": CAP, "prompt_sha256": token_ids_sha256(ids[i])})
            table = pa.Table.from_pylist(rows).replace_schema_metadata({"settings": settings})
            write_parquet_checked(table, path)
            bar.update(len(chunk))
    del llm
    return path


def _params(seed: int):
    from vllm import SamplingParams

    return SamplingParams(temperature=TEMPERATURE, top_p=TOP_P, max_tokens=CAP, seed=seed)


def _engine(model_dir: str, cfg: OutsideServeConfig, traffic: Path):
    """``vllm.LLM`` on the default model with the plug-in observing and logging (the shipped head)."""
    from vllm import LLM

    from lenpred.serving.vllm.config import EngineConfig

    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    plugin = EngineConfig(policy="observe", traffic_log=str(traffic))
    return LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=4096,
               max_num_seqs=cfg.max_num_seqs, kv_cache_memory_bytes=cfg.kv_cache_bytes, seed=0,
               generation_config="vllm", worker_cls="lenpred.serving.vllm.worker.LenpredCPUWorker",
               scheduler_cls="lenpred.serving.vllm.scheduler.LenpredScheduler",
               additional_config=json.loads(plugin.to_json()))
