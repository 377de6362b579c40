"""Every measurement source the docs cite is in the repo, and every section of
docs/performance.md that quotes a timed figure names one (issue 26, item 5).

A cited source is a path under ``docs/measurements/`` or ``docs/performance/`` written in
README.md or docs/*.md, with or without the leading ``docs/`` (the docs write both
``docs/measurements/...`` and ``measurements/...``). Brace groups (``{fp16,bf16}``) are
expanded and ``*`` / ``?`` are globbed; each expansion must match at least one file or folder.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# A path starts at ``measurements/`` or ``performance/`` (optionally after ``docs/``) and runs
# until whitespace, a backtick, a quote or a closing bracket. Trailing sentence punctuation is
# stripped afterwards. ``performance/`` paths count only with a data-file suffix.
_PATH = re.compile(r"(?<![\w./-])(?:docs/)?(measurements|performance)/[^\s`'\"()\[\]<>|]*")
_PERF_SUFFIX = re.compile(r"\.(?:json|png|md|log)$")
_BRACE = re.compile(r"\{([^{}]*)\}")
_UNIT_FIGURE = re.compile(r"\d\s*(?:µs|ms|TFLOP/s|TB/s|GB/s)(?![\w/])")
_SOURCE = re.compile(r"(?:docs/)?(?:measurements|performance)/\S")


def doc_files() -> list[Path]:
    """README.md and every docs/*.md."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def expand_braces(text: str) -> list[str]:
    """``a{b,c}d{e,f}`` -> ``abde, abdf, acde, acdf`` (no nesting, as the docs write them)."""
    parts = _BRACE.split(text)
    # split() alternates literal text and the inside of a brace group
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def cited_paths(text: str) -> list[str]:
    """The measurement paths cited in ``text``, relative to docs/, braces unexpanded."""
    found: list[str] = []
    for m in _PATH.finditer(text):
        path = m.group(0).removeprefix("docs/")
        path = path.rstrip(".,:;…")
        if m.group(1) == "performance" and not _PERF_SUFFIX.search(path):
            continue
        if path in ("measurements/", "performance/", "measurements", "performance"):
            continue  # the folder itself, e.g. a path broken over two lines
        found.append(path)
    return found


def missing(path: str) -> list[str]:
    """The expansions of ``path`` (relative to docs/) that match nothing in the repo."""
    absent = []
    for one in expand_braces(path):
        if any(ch in one for ch in "*?"):
            if not any(DOCS.glob(one.rstrip("/"))):
                absent.append(one)
        elif not (DOCS / one).exists():
            absent.append(one)
    return absent


def all_citations() -> list[tuple[str, str]]:
    """(file name, cited path) for every citation in the docs, each pair once."""
    seen: dict[tuple[str, str], None] = {}
    for f in doc_files():
        for path in cited_paths(f.read_text(encoding="utf-8")):
            seen[(f.relative_to(ROOT).as_posix(), path)] = None
    return list(seen)


CITATIONS = all_citations()


def test_docs_cite_measurements() -> None:
    # The extractor must see the docs' citations at all (a broken pattern passes vacuously).
    assert len(CITATIONS) > 50
    cited = {p for _, p in CITATIONS}
    assert "measurements/2026-11-30-splitkv-decode-bench.{md,json}" in cited
    assert "performance/compare_sdpa_families_2026-11-30.json" in cited


@pytest.mark.parametrize(("doc", "path"), CITATIONS, ids=[f"{d}:{p}" for d, p in CITATIONS])
def test_cited_source_exists(doc: str, path: str) -> None:
    absent = missing(path)
    assert not absent, f"{doc} cites docs/{path}, but these are not in the repo: {absent}"


def test_checker_reports_missing_files() -> None:
    text = (
        "raw: docs/measurements/1999-01-01-nowhere/run.{json,log}; "
        "`measurements/2026-11-30-families-*`, performance/compare_sdpa_{fp16,nope}.png."
    )
    paths = cited_paths(text)
    assert paths == [
        "measurements/1999-01-01-nowhere/run.{json,log}",
        "measurements/2026-11-30-families-*",
        "performance/compare_sdpa_{fp16,nope}.png",
    ]
    assert missing(paths[0]) == [
        "measurements/1999-01-01-nowhere/run.json",
        "measurements/1999-01-01-nowhere/run.log",
    ]
    assert missing(paths[1]) == []
    assert missing(paths[2]) == ["performance/compare_sdpa_nope.png"]


def performance_sections() -> list[tuple[str, str]]:
    """(heading, body) of each ``## `` section of docs/performance.md (subsections included)."""
    text = (DOCS / "performance.md").read_text(encoding="utf-8")
    chunks = re.split(r"^(?=## )", text, flags=re.MULTILINE)
    return [(c.splitlines()[0], c) for c in chunks if c.startswith("## ")]


SECTIONS = performance_sections()


def test_performance_has_sections() -> None:
    assert len(SECTIONS) >= 5


@pytest.mark.parametrize(("heading", "body"), SECTIONS, ids=[h for h, _ in SECTIONS])
def test_performance_section_cites_source(heading: str, body: str) -> None:
    figures = _UNIT_FIGURE.findall(body)
    if not figures:
        return
    assert _SOURCE.search(body), (
        f"docs/performance.md section {heading!r} quotes figures ({figures[:3]}) but cites no"
        " docs/measurements/ or docs/performance/ source"
    )
