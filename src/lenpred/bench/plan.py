"""Benchmark configuration and the deterministic sampling plan (which prompts, which split, which seeds).

The plan is a pure function of the config, the data files and the tokenizer: prompts of each
scenario are shuffled per source with the config seed and interleaved across sources, so a larger
``num_prompts`` extends a smaller plan rather than reshuffling it; a prompt's split comes from a
hash of its id, so it never moves between splits when the benchmark grows.

Users' prompt files (:mod:`lenpred.bench.user_prompts`) are planned the same way, one scenario per file's
``scenario`` name, except that a prompt's split comes from a hash of its normalised text, so duplicates (in one
file or across files) always share a split.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import Any

from lenpred.bench.sources import SCENARIOS, SOURCES, load_prompts
from lenpred.bench.user_prompts import PromptFileConfig, check_distinct, prompt_sha256, read_prompt_file
from lenpred.errors import LenpredError
from lenpred.prompts import chat_token_ids, check_fits, normalise_text, prompt_text

SPLITS = ("train", "validation", "test")


@dataclass
class ScenarioConfig:
    """How one scenario is sampled (``sources`` and ``num_prompts`` by position, the rest by keyword).

    Attributes:
        sources: prompt sources (registry names) pooled into this scenario.
        num_prompts: prompts drawn in all, across splits.
        samples_per_prompt: responses per train prompt.
        eval_samples_per_prompt: responses per validation/test prompt (more samples there measure the
            irreducible scatter of a prompt's lengths).
        temperature: sampling temperature (0.7 chat/CoT, 1.0 RL rollouts in ForeLen).
        max_new_tokens: generation cap; capped responses are recorded as ``finish_reason="length"``.
    """

    sources: list[str]
    num_prompts: int
    _: KW_ONLY
    samples_per_prompt: int = 1
    eval_samples_per_prompt: int = 1
    temperature: float = 0.7
    max_new_tokens: int = 512

    def __post_init__(self):
        if not self.sources:
            raise LenpredError("a scenario needs at least one source; valid sources: " + ", ".join(SOURCES))
        unknown = [s for s in self.sources if s not in SOURCES]
        if unknown:
            raise LenpredError(f"unknown sources {unknown}; valid sources: {', '.join(SOURCES)}")
        if self.num_prompts < 1 or self.samples_per_prompt < 1 or self.eval_samples_per_prompt < 1:
            raise LenpredError("num_prompts and samples per prompt must be >= 1")
        if not 0 < self.temperature <= 2 or self.max_new_tokens < 1:
            raise LenpredError("temperature must be in (0, 2] and max_new_tokens >= 1")


@dataclass
class BenchConfig:
    """A ForeLen-style benchmark for one model.

    Attributes:
        model: backbone name (alias, hub id or directory) whose responses are sampled.
        scenarios: per-scenario settings, keyed by ``longseq`` / ``reasoning`` / ``rl``.
        split_fractions: train / validation / test shares of the prompts (by prompt, never by sample).
        seed: fixes prompt order, splits and every per-request seed.
        max_prompt_tokens: longer chat-formatted prompts are left out of the plan (and counted). Once the model
            is known it must leave room for every scenario's ``max_new_tokens`` in the model's context window
            (:func:`prompt_limits`); ``None``: as long as that window allows (context window minus the scenario's
            ``max_new_tokens``).
        shard_size: prompts per shard (the unit of atomic writes and of resuming).
        prompt_files: users' prompt files with their own scenario names and sampling settings
            (:class:`lenpred.bench.user_prompts.PromptFileConfig`); planned after the registered scenarios.
    """

    model: str
    scenarios: dict[str, ScenarioConfig]
    split_fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)
    seed: int = 0
    max_prompt_tokens: int | None = 2048
    shard_size: int = 16
    prompt_files: list[PromptFileConfig] = field(default_factory=list)

    def __post_init__(self):
        self.scenarios = {k: v if isinstance(v, ScenarioConfig) else ScenarioConfig(**v)
                          for k, v in self.scenarios.items()}
        self.prompt_files = [f if isinstance(f, PromptFileConfig) else PromptFileConfig(**f)
                             for f in self.prompt_files]
        check_distinct(self.prompt_files)
        if not self.scenarios and not self.prompt_files:
            raise LenpredError(f"a benchmark needs at least one scenario of {', '.join(SCENARIOS)} or a prompt file")
        bad = [k for k in self.scenarios if k not in SCENARIOS]
        if bad:
            raise LenpredError(f"unknown scenarios {bad}; valid scenarios: {', '.join(SCENARIOS)}")
        self.split_fractions = tuple(float(x) for x in self.split_fractions)
        if len(self.split_fractions) != 3 or abs(sum(self.split_fractions) - 1) > 1e-6:
            raise LenpredError("split_fractions must be three shares (train, validation, test) summing to 1")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise LenpredError(f"max_prompt_tokens must be >= 1 (or None: as long as the context window allows), "
                               f"got {self.max_prompt_tokens}")
        if self.shard_size < 1:
            raise LenpredError(f"shard_size must be >= 1, got {self.shard_size}")

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (``prompt_files`` only when there are any: preset manifests stay as they were)."""
        d = asdict(self)
        if not self.prompt_files:
            del d["prompt_files"]
        return d


def preset(name: str, model: str) -> BenchConfig:
    """Named benchmark configurations.

    * ``first``: ~300 prompts / ~600 responses (100 long-form, 100 CoT, 100 RL x 4), 512 tokens.
    * ``forelen``: the full ForeLen-style build (>=1,500 prompts, >=4,500 responses; RL x 8;
      4 samples on validation/test prompts of long-form and CoT; 1024 tokens for long-form).
    * ``tiny``: 3 prompts per scenario, 16 tokens, prompts as long as the model's window allows (tests and
      smoke runs, also with small-window test models).

    ``first`` and ``forelen`` keep ``max_prompt_tokens=2048``: the committed benchmarks were planned with it.
    """
    longseq = ["longbench_write", "ifeval", "mt_bench", "vicuna_bench", "self_instruct", "alpaca_eval",
               "alpaca_demo", "sharegpt", "oasst"]
    reasoning = ["gsm8k", "math", "math500", "aqua", "strategyqa"]
    if name == "first":
        return BenchConfig(model, {
            "longseq": ScenarioConfig(longseq, 100, max_new_tokens=512),
            "reasoning": ScenarioConfig(["gsm8k", "math", "aqua"], 100, max_new_tokens=512),
            "rl": ScenarioConfig(["gsm8k_train", "mbpp"], 100, samples_per_prompt=4, eval_samples_per_prompt=4,
                                 temperature=1.0, max_new_tokens=512)}, shard_size=32)
    if name == "forelen":
        return BenchConfig(model, {
            "longseq": ScenarioConfig(longseq, 600, eval_samples_per_prompt=4, max_new_tokens=1024),
            "reasoning": ScenarioConfig(reasoning, 600, eval_samples_per_prompt=4, max_new_tokens=512),
            "rl": ScenarioConfig(["gsm8k_train", "math_train", "mbpp", "humaneval"], 320, samples_per_prompt=8,
                                 eval_samples_per_prompt=8, temperature=1.0, max_new_tokens=512)}, shard_size=32)
    if name == "tiny":
        return BenchConfig(model, {
            "longseq": ScenarioConfig(["vicuna_bench", "oasst"], 3, eval_samples_per_prompt=2, max_new_tokens=16),
            "reasoning": ScenarioConfig(["gsm8k"], 3, max_new_tokens=16),
            "rl": ScenarioConfig(["mbpp"], 3, samples_per_prompt=2, eval_samples_per_prompt=2, temperature=1.0,
                                 max_new_tokens=16)}, max_prompt_tokens=None, shard_size=2)
    raise LenpredError(f"unknown preset '{name}'; valid presets: first, forelen, tiny")


@dataclass(frozen=True)
class PlannedPrompt:
    """One prompt of the plan with the seeds of all its samples.

    Attributes:
        top_p: nucleus mass kept (1.0 = off; only prompt files set it).
        prompt_sha256: :func:`lenpred.bench.user_prompts.prompt_sha256` of the prompt's messages.
        from_file: the prompt comes from a user prompt file (id ``"<name>:<line>"``), not a registered source.
    """

    scenario: str
    source: str
    prompt_id: str
    split: str
    num_prompt_tokens: int
    prompt_token_ids: tuple[int, ...] = field(repr=False)
    seeds: tuple[int, ...]
    temperature: float
    max_new_tokens: int
    top_p: float = 1.0
    prompt_sha256: str = ""
    from_file: bool = False


def _unit_hash(*parts: Any) -> float:
    """Deterministic number in [0, 1) from the parts (stable across Python runs, unlike ``hash``)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_split(prompt_id: str, seed: int, fractions: tuple[float, float, float]) -> str:
    """Split of a prompt, from a hash of its id (or, for prompt files, of its normalised text): stable when the
    benchmark grows."""
    u = _unit_hash("split", seed, prompt_id)
    return "train" if u < fractions[0] else "validation" if u < fractions[0] + fractions[1] else "test"


def sample_seed(prompt_id: str, sample_index: int, seed: int) -> int:
    """Per-request sampling seed in [0, 2**31) from the prompt id and sample index."""
    return int(_unit_hash("sample", seed, prompt_id, sample_index) * 2**31)


def _interleaved_prompt_ids(cfg: ScenarioConfig, seed: int, data_dir) -> list[tuple[str, list]]:
    pools = []
    for name in cfg.sources:
        items = list(load_prompts(name, data_dir).items())
        random.Random(f"{seed}:{name}").shuffle(items)
        pools.append(items)
    out = []
    for i in range(max(len(p) for p in pools)):
        out.extend(p[i] for p in pools if i < len(p))
    return out


def _prompt_limit(config: BenchConfig, max_new_tokens: int, context_window: int | None, what: str) -> int:
    """Longest chat-formatted prompt a group with this ``max_new_tokens`` takes (see :func:`prompt_limits`)."""
    if context_window is None:
        if config.max_prompt_tokens is None:
            raise LenpredError("max_prompt_tokens=None needs the model's context window: pass context_window")
        return config.max_prompt_tokens
    prompt = config.max_prompt_tokens if config.max_prompt_tokens is not None else 1
    check_fits(prompt, max_new_tokens, context_window,
               what=f"bench max_prompt_tokens ({what})" if config.max_prompt_tokens is not None
               else f"a 1-token prompt ({what})")
    return config.max_prompt_tokens or context_window - max_new_tokens


def prompt_limits(config: BenchConfig, context_window: int | None) -> dict[str, int]:
    """Longest chat-formatted prompt each scenario takes, from the one length rule
    (:func:`lenpred.prompts.check_fits`: prompt + ``max_new_tokens`` within the model's context window).

    Args:
        context_window: the model's context window in tokens; ``None`` (model unknown) trusts
            ``config.max_prompt_tokens``.

    Returns:
        ``{scenario: max prompt tokens}`` of the registered scenarios (prompt files: :func:`prompt_file_limits`):
        ``max_prompt_tokens``, or ``context_window - max_new_tokens`` when it is ``None``.

    Raises:
        LenpredError: ``max_prompt_tokens`` plus a scenario's ``max_new_tokens`` exceeds the context window, a
            scenario's ``max_new_tokens`` leaves no room for a prompt, or both the limit and the window are unknown.
    """
    return {scenario: _prompt_limit(config, cfg.max_new_tokens, context_window, f"scenario '{scenario}'")
            for scenario, cfg in config.scenarios.items()}


def prompt_file_limits(config: BenchConfig, context_window: int | None) -> dict[str, int]:
    """``{prompt file name: max prompt tokens}``, by the same rule as :func:`prompt_limits`.

    Raises:
        LenpredError: as :func:`prompt_limits`, naming the prompt file.
    """
    return {f.name: _prompt_limit(config, f.max_new_tokens, context_window, f"prompt file '{f.name}'")
            for f in config.prompt_files}


def _tokens(tokenizer, messages, where: str) -> list[int]:
    try:
        return chat_token_ids(tokenizer, messages)
    except LenpredError as exc:
        raise LenpredError(f"{where}: {exc}") from None


def _plan_items(items, scenario: str, settings, config: BenchConfig, tokenizer, limit: int,
                from_file: bool = False) -> tuple[list[PlannedPrompt], int]:
    """Plan ``items`` — ``(prompt_id, split_key, where, messages)`` in order — until ``settings.num_prompts`` fit in
    ``limit`` prompt tokens (``None``: all); returns the planned prompts and how many were too long. ``settings`` is a
    :class:`ScenarioConfig` or a prompt file's config (samples, temperature, cap, and top_p for files)."""
    chosen, skipped = [], 0
    for prompt_id, split_key, where, messages in items:
        if len(chosen) == settings.num_prompts:
            break
        ids = _tokens(tokenizer, messages, where)
        if len(ids) > limit:
            skipped += 1
            continue
        split = assign_split(split_key, config.seed, config.split_fractions)
        k = settings.samples_per_prompt if split == "train" else settings.eval_samples_per_prompt
        chosen.append(PlannedPrompt(scenario, prompt_id.rpartition(":")[0], prompt_id, split, len(ids), tuple(ids),
                                    tuple(sample_seed(prompt_id, s, config.seed) for s in range(k)),
                                    settings.temperature, settings.max_new_tokens, getattr(settings, "top_p", 1.0),
                                    prompt_sha256(messages), from_file=from_file))
    return chosen, skipped


def _plan_scenario(scenario: str, cfg: ScenarioConfig, config: BenchConfig, tokenizer, data_dir,
                   limit: int) -> tuple[list[PlannedPrompt], int]:
    """The planned prompts of one registered scenario and how many were too long."""
    items = ((pid, pid, f"prompt {pid}", messages) for pid, messages in
             _interleaved_prompt_ids(cfg, config.seed, data_dir))
    chosen, skipped = _plan_items(items, scenario, cfg, config, tokenizer, limit)
    if len(chosen) < cfg.num_prompts:
        raise LenpredError(f"scenario '{scenario}' asks for {cfg.num_prompts} prompts but its sources hold only "
                           f"{len(chosen)} usable ones; lower num_prompts or add sources")
    return chosen, skipped


def text_split_key(messages) -> str:
    """What a prompt file's prompt is split by: the SHA-256 of its normalised text (lower-cased, whitespace
    collapsed, as :func:`lenpred.prompts.normalise_text`), so duplicates share a split."""
    return "text:" + hashlib.sha256(normalise_text(prompt_text(messages)).encode("utf-8")).hexdigest()


def _plan_file(f: PromptFileConfig, config: BenchConfig, tokenizer, limit: int) -> tuple[list[PlannedPrompt], int]:
    """The planned prompts of one prompt file (seeded order; ``num_prompts`` of them, or all) and how many were too
    long."""
    items = list(read_prompt_file(f.path).prompts.items())
    random.Random(f"{config.seed}:{f.name}").shuffle(items)
    keyed = ((f"{f.name}:{line}", text_split_key(messages), f"line {line} of {f.path}", messages)
             for line, messages in items)
    chosen, skipped = _plan_items(keyed, f.scenario, f, config, tokenizer, limit, from_file=True)
    if not chosen or (f.num_prompts is not None and len(chosen) < f.num_prompts):
        raise LenpredError(f"prompt file {f.path} has {len(chosen)} prompts that fit (of {len(items)}; {skipped} "
                           f"longer than {limit} tokens){f' but num_prompts is {f.num_prompts}' if chosen else ''}: "
                           "lower num_prompts, max_new_tokens or add prompts")
    return chosen, skipped


def _interleave(pools: list[list[PlannedPrompt]]) -> list[PlannedPrompt]:
    out = []
    for i in range(max((len(p) for p in pools), default=0)):
        out.extend(p[i] for p in pools if i < len(p))
    return out


def make_plan(config: BenchConfig, tokenizer, data_dir=None,
              context_window: int | None = None) -> tuple[list[PlannedPrompt], dict[str, int]]:
    """The full, ordered plan: scenarios interleaved prompt by prompt so any prefix covers all of them.

    Prompts are prepared by :func:`lenpred.prompts.chat_token_ids` (the one template and special-token rule).
    Registered scenarios come first in the interleaving, then the prompt files' scenarios (the files of one
    scenario interleaved with each other).

    Args:
        context_window: the model's context window in tokens (checked against the limits up front,
            :func:`prompt_limits`); ``None`` only when ``config.max_prompt_tokens`` is set.

    Returns:
        ``(plan, skipped)`` where ``skipped`` counts prompts left out per scenario for exceeding
        the scenario's prompt limit.

    Raises:
        LenpredError: limits that do not fit the context window, a data or prompt file that is missing or holds
            bad text (named with its record or line), a prompt that cannot be prepared (named by its id, or file and
            line), or too few usable prompts.
    """
    limits = prompt_limits(config, context_window)
    file_limits = prompt_file_limits(config, context_window)
    groups: dict[tuple[str, str], list[list[PlannedPrompt]]] = {}
    skipped: dict[str, int] = {}
    for scenario, cfg in config.scenarios.items():
        chosen, skipped[scenario] = _plan_scenario(scenario, cfg, config, tokenizer, data_dir, limits[scenario])
        groups[("source", scenario)] = [chosen]
    for f in config.prompt_files:
        chosen, n_long = _plan_file(f, config, tokenizer, file_limits[f.name])
        skipped[f.scenario] = skipped.get(f.scenario, 0) + n_long
        groups.setdefault(("file", f.scenario), []).append(chosen)
    return _interleave([_interleave(pools) for pools in groups.values()]), skipped


def plan_fingerprint(plan: list[PlannedPrompt]) -> str:
    """Hash of everything that determines the records (ids, prompt tokens, seeds, sampling params; for prompt files
    also top-p and the prompt's content hash)."""
    h = hashlib.sha256()
    for p in plan:
        key = (p.prompt_id, p.split, p.prompt_token_ids, p.seeds, p.temperature, p.max_new_tokens)
        if p.from_file:  # only here: plans of registered sources keep the fingerprints they were built with
            key += (p.top_p, p.prompt_sha256)
        h.update(repr(key).encode())
    return h.hexdigest()[:16]
