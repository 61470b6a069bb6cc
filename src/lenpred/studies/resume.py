"""The one resume rule of the real runs: finished runs stored in a JSON file are kept only when the settings they
were made with match the current ones; a mismatch is an error naming the file, the settings that differ and the fix
(never a silent restart that would overwrite finished runs, nor a silent mix of two settings in one report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lenpred.errors import LenpredError


def _as_stored(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists, keys strings)."""
    return json.loads(json.dumps(value))


def load_resumable(path: str | Path, config: dict, ignore: tuple[str, ...] = (), defaults: dict | None = None,
                   fingerprint: dict[str, Any] | None = None) -> dict:
    """Finished runs to resume from ``path``, or a fresh record.

    The record is a dict ``{"config": config, "runs": {}, **fingerprint}`` (callers add their own keys). A stored
    record is kept when, after a JSON round trip, its ``"config"`` equals ``config`` on every key not in ``ignore``
    (settings that do not change a finished run, e.g. the number of draws or bootstrap resamples), and every
    ``fingerprint`` value it stores equals the given one (e.g. an arrival rate derived at run time; a value not yet
    stored is accepted). A key the stored config lacks (a file from before that setting existed) counts as
    ``defaults[key]``, the value runs were made with then; without ``defaults`` it counts as matching.

    Args:
        path: the JSON file of finished runs (need not exist).
        config: the current settings (a dataclass's ``asdict``); stored as the record's ``"config"``.
        ignore: config keys that may differ.
        defaults: per key, the value a stored config that lacks the key was made with.
        fingerprint: top-level values that must match the stored ones.

    Returns:
        The stored record with ``"config"`` and the fingerprint set to the current values, or a fresh one.

    Raises:
        LenpredError: the stored settings differ (the message names the file, the keys and the fix).
    """
    path = Path(path)
    fingerprint = dict(fingerprint or {})
    if not path.exists():
        return {"config": config, "runs": {}, **fingerprint}
    record = json.loads(path.read_text())
    stored, current = record.get("config", {}), _as_stored(config)
    defaults = current if defaults is None else _as_stored(defaults)
    stored = {**{k: defaults[k] for k in current if k in defaults}, **stored}
    keys = (set(stored) | set(current)) - set(ignore)
    differ = sorted(k for k in keys if stored.get(k, "<absent>") != current.get(k, "<absent>"))
    for k, v in fingerprint.items():
        if record.get(k) is not None and record[k] != _as_stored(v):
            differ.append(k)
    if differ:
        shown = ", ".join(f"{k} {stored.get(k, record.get(k))!r} (now {current.get(k, fingerprint.get(k))!r})"
                          for k in differ)
        raise LenpredError(f"{path} holds runs with other settings ({shown}): delete it or write to another output "
                           "directory")
    record["config"] = config
    record.setdefault("runs", {})
    record.update(fingerprint)
    return record
