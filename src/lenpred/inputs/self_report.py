"""The ``self_report`` input (PiA): the serving model's own answer to "how long will your answer be?"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lenpred.backbone import cache_dir
from lenpred.inputs.pia import ask_self_reports, tokens_per_word
from lenpred.inputs.registry import register_provider


@register_provider("self_report")
def provide_self_reports(backbone, data, settings: dict[str, Any]) -> dict[str, Any]:
    """Ask the model about every test prompt (greedy, cached under ``$LENPRED_CACHE/self_reports``) and set
    ``Request.self_report``. Returns ``{"tokens_per_word": ...}`` measured on the training responses (what converts a
    stated word count to tokens)."""
    test_ids = list(dict.fromkeys(data.cols["prompt_id"][data.index["test"]]))
    cache = cache_dir() / "self_reports" / f"{Path(settings['bench']).name}-{backbone.revision}.json"
    reports = ask_self_reports(backbone, {p: data.messages[p] for p in test_ids}, cache, skip_too_long=True)
    for p, text in reports.items():
        data.by_prompt[p].self_report = text
    train_responses = [list(r) for r in data.responses[np.asarray(data.index["train"])]]
    return {"tokens_per_word": tokens_per_word(backbone.tokenizer, train_responses)}
