"""Every relative link in README.md and docs/*.md points to a file in the repository and, with ``#anchor``, to a
heading there (GitHub's anchor rule); no doc points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUTSIDE_PATHS_ALLOWED = ("../shared/datasets", "../shared/traces")
"""Paths outside the repository a doc may name: the default prompt data and arrival-trace directories, which a user
overrides (``LENPRED_DATA_DIR``, ``LENPRED_TRACE_DIR``)."""

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)


def _prose(text: str) -> str:
    """The text without fenced code blocks or code spans (links inside them are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: its text without Markdown markup, lower-cased, every character but letters,
    digits, ``-``, ``_`` and spaces dropped, spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").replace("*", "")
    text = "".join(c for c in text.strip().lower() if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings, duplicates numbered as GitHub does (``name``, ``name-1``, …)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = github_anchor(m.group(1))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def links(path: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(_prose(path.read_text()))]


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)  # http:, https:, mailto:


def test_github_anchor_rule():
    assert github_anchor("Serving behind vLLM: `lenpred serve`") == "serving-behind-vllm-lenpred-serve"
    assert github_anchor("The proxy's latency, a second run") == "the-proxys-latency-a-second-run"
    assert github_anchor("Set-up (two commands)") == "set-up-two-commands"
    assert github_anchor("Real run 3: behind `vllm serve`, the first proxy") == \
        "real-run-3-behind-vllm-serve-the-first-proxy"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_relative_link_resolves(doc):
    broken = []
    for target in links(doc):
        if not _relative(target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if ROOT not in file.parents and file != ROOT:
            broken.append(f"{target}: outside the repository")
        elif not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with anchor #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_no_doc_points_outside_the_repository(doc):
    text = doc.read_text()
    assert "DESIGN.md" not in text, f"{doc.name} names DESIGN.md, which is not in the repository"
    for m in re.finditer(r"(?:\.\./)+[\w./-]*", text):
        if m.group(0).startswith(OUTSIDE_PATHS_ALLOWED):
            continue
        path = (doc.parent / m.group(0)).resolve()
        assert path == ROOT or ROOT in path.parents, f"{doc.name} names {m.group(0)!r}, outside the repository"


def test_no_code_cites_a_design_note_outside_the_repository():
    """The code's docstrings cite papers, libraries and the docs here, never the workplace's design notes."""
    named = [str(p.relative_to(ROOT)) for folder in ("src", "scripts", "tests") for p in (ROOT / folder).rglob("*.py")
             if p.name != "test_doc_links.py" and re.search(r"\b(DESIGN|STYLE)\.md\b", p.read_text())]
    assert named == []
